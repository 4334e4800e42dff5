"""InferenceSession: onnxruntime's API over the ExecutionPlan (switch by changing one import)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnx_prepared.errors import InvalidFeedError
from onnx_prepared.model import ExternalDataReader, LoadedModel, load_model
from onnx_prepared.plan import ExecutionPlan, build_execution_plan


@dataclass
class SessionOptions:
    """Session settings. Unknown onnxruntime options are accepted and ignored, so ORT code runs as is."""

    intra_op_num_threads: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __setattr__(self, name: str, value: Any) -> None:  # accept ORT's attribute zoo
        object.__setattr__(self, name, value)


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, strings or None), type string."""

    name: str
    shape: list
    type: str


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


def _type_string(tp: onnx.TypeProto) -> str:
    if tp.HasField("tensor_type"):
        np_t = helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type) if tp.tensor_type.elem_type else None
        return f"tensor({_ORT_TYPE.get(np.dtype(np_t).name, np.dtype(np_t).name) if np_t is not None else 'undefined'})"
    if tp.HasField("sequence_type"):
        return f"seq({_type_string(tp.sequence_type.elem_type)})"
    if tp.HasField("optional_type"):
        return f"optional({_type_string(tp.optional_type.elem_type)})"
    if tp.HasField("map_type"):
        return "map"
    return "unknown"


_ORT_TYPE = {"float32": "float", "float64": "double", "object": "string", "bool": "bool"}


def _shape(tp: onnx.TypeProto) -> list:
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return []
    out = []
    for d in tp.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return out


class InferenceSession:
    """Run an ONNX model; shaped like ``onnxruntime.InferenceSession``.

    >>> sess = InferenceSession("model.onnx")
    >>> (y,) = sess.run(None, {"x": x})
    """

    def __init__(self, path: str | os.PathLike, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, **kwargs: Any) -> None:
        self._options = sess_options or SessionOptions()
        self._model: LoadedModel = load_model(path)
        g = self._model.graph
        self._plan: ExecutionPlan = build_execution_plan(g, self._model.opsets, self._model.functions)
        self._reader = ExternalDataReader()
        init_names = set(self._model.weights)
        self._inputs = [NodeArg(i.name, _shape(i.type), _type_string(i.type)) for i in g.input
                        if i.name not in init_names]
        self._input_types = {i.name: i.type for i in g.input}
        self._outputs = [NodeArg(o.name, _shape(o.type), _type_string(o.type)) for o in g.output]
        # Issue 2 runtime core: constants are read once at session creation (prepared execution
        # replaces this with overlapped, on-demand reads).
        self._constants = [None] * self._plan.n_slots
        for name, s in self._plan.constant_slots.items():
            desc = self._model.weights.get(name)
            if desc is not None:
                self._constants[s] = self._reader.read(desc)
        for sp in g.sparse_initializer:
            self._constants[self._plan.constant_slots[sp.values.name]] = _sparse_to_dense(sp)
        self._slot_of = {n: i for i, n in enumerate(self._plan.slot_names)}
        self._reader.close()

    # ---- onnxruntime-compatible surface ----
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return []

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        m = self._model.model
        return ModelMetadata(m.producer_name, m.graph.name, m.domain, m.doc_string, m.graph.doc_string,
                             m.model_version, {p.key: p.value for p in m.metadata_props})

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list:
        values = list(self._constants)
        plan = self._plan
        for name in self._slot_input_names():
            if name not in input_feed:
                raise InvalidFeedError(f"missing input {name!r}; expected inputs: {[i.name for i in self._inputs]}")
        for name, v in input_feed.items():
            values[self._input_slot(name)] = self._check_feed(name, v)
        plan.replay(values)
        if output_names is None:
            return [values[s] for s in plan.output_slots]
        out_index = {o.name: s for o, s in zip(self._outputs, plan.output_slots)}
        try:
            return [values[out_index[n]] for n in output_names]
        except KeyError as e:
            raise InvalidFeedError(f"unknown output {e.args[0]!r}; outputs: {list(out_index)}") from None

    # ---- feeds ----
    def _slot_input_names(self) -> list[str]:
        return [self._plan.slot_names[s] for s in self._plan.input_slots]

    def _input_slot(self, name: str) -> int:
        if name not in self._input_types:
            raise InvalidFeedError(f"unknown input {name!r}; expected inputs: {[i.name for i in self._inputs]}")
        return self._slot_of[name]

    def _check_feed(self, name: str, v: Any) -> Any:
        tp = self._input_types[name]
        if not tp.HasField("tensor_type"):
            return v
        arr = np.asarray(v) if not isinstance(v, np.ndarray) else v
        et = tp.tensor_type.elem_type
        if et:
            want = np.dtype(helper.tensor_dtype_to_np_dtype(et))
            if arr.dtype != want and not (want.kind == "O" and arr.dtype.kind in "OUS"):
                raise InvalidFeedError(f"input {name!r} has dtype {arr.dtype}, the model expects {want}")
        if tp.tensor_type.HasField("shape"):
            dims = tp.tensor_type.shape.dim
            if arr.ndim != len(dims):
                raise InvalidFeedError(f"input {name!r} has rank {arr.ndim} (shape {list(arr.shape)}), "
                                       f"the model expects rank {len(dims)} ({_shape(tp)})")
            for i, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value != arr.shape[i]:
                    raise InvalidFeedError(f"input {name!r} has shape {list(arr.shape)}, the model expects "
                                           f"{_shape(tp)} (dimension {i})")
        return arr


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    from onnx import numpy_helper

    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(indices.T, tuple(sp.dims))
    dense[indices] = values
    return dense.reshape(tuple(sp.dims))
