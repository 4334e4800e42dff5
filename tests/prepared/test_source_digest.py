"""source_model_digest: the model's identity without its weights' recorded checksums, however it is computed."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

from onnx_prepared.prepared import cache


def _model(node_name: str = "n", checksum: str | None = None) -> onnx.ModelProto:
    w = helper.make_tensor("W", T.FLOAT, [4], np.zeros(4, np.float32).tobytes(), raw=True)
    w.data_location = T.EXTERNAL
    w.ClearField("raw_data")
    entries = [("location", "w.bin"), ("offset", "0"), ("length", "16")]
    if checksum is not None:
        entries.append(("checksum", checksum))
    for k, v in entries:
        w.external_data.add(key=k, value=v)
    g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"], name=node_name)], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _expected(m: onnx.ModelProto) -> str:
    """The definition: sha256 of the deterministic serialization with every checksum entry removed."""
    s = onnx.ModelProto()
    s.CopyFrom(m)
    for t in s.graph.initializer:
        keep = [(e.key, e.value) for e in t.external_data if e.key != "checksum"]
        del t.external_data[:]
        for k, v in keep:
            t.external_data.add(key=k, value=v)
    return hashlib.sha256(s.SerializeToString(deterministic=True)).hexdigest()


def test_digest_ignores_recorded_checksums_on_every_path():
    plain = _model()
    with_sum = _model(checksum="sha256:" + "ab" * 32)
    other_sum = _model(checksum="sha256:" + "cd" * 32)
    named = _model(node_name="checksum")  # the word in the bytes, no checksum entry
    digests = [cache._model_digest(m) for m in (plain, with_sum, other_sum, named)]
    assert digests == [_expected(m) for m in (plain, with_sum, other_sum, named)]
    assert digests[0] == digests[1] == digests[2] != digests[3]
    again = onnx.ModelProto()
    again.ParseFromString(with_sum.SerializeToString())  # a new parse of the same bytes: remembered
    assert cache._model_digest(again) == digests[1]
    assert cache._model_digest(again) == digests[1]
