"""Builders for models whose initializers live in hand-written external data files (imported by the tests here)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper


@dataclass
class Spec:
    """One initializer to write: its value, whether it goes to the data file, and entry overrides.

    ``entries`` overrides the external_data keys the builder writes (a value of None removes the key).
    """

    name: str
    value: np.ndarray
    external: bool = True
    entries: dict[str, str | None] = field(default_factory=dict)


def write_model(folder, specs: list[Spec], *, data_name: str = "weights.bin", align: int = 64,
                pad_byte: int = 0xAB, trailing: int = 3, model_name: str = "model.onnx") -> str:
    """Write ``model_name`` + ``data_name`` into ``folder``; external tensors start at ``align``-aligned
    offsets with ``pad_byte`` filler between them (so a reader that ignores offsets reads garbage)."""
    folder = os.fspath(folder)
    data = bytearray()
    inits = []
    for s in specs:
        t = numpy_helper.from_array(s.value, s.name)
        if s.external:
            off = -(-len(data) // align) * align
            data += bytes([pad_byte]) * (off - len(data))
            data += t.raw_data
            entries = {"location": data_name, "offset": str(off), "length": str(len(t.raw_data))}
            entries.update(s.entries)
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in entries.items():
                if v is not None:
                    e = t.external_data.add()
                    e.key, e.value = k, v
        inits.append(t)
    data += bytes([pad_byte]) * trailing  # "length absent = rest of file" must notice these
    if any(s.external for s in specs):
        with open(os.path.join(folder, data_name), "wb") as f:
            f.write(data)
    outputs = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph([], "g", [], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    path = os.path.join(folder, model_name)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path
