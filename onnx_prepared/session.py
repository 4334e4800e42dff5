"""InferenceSession: onnxruntime's API over the ExecutionPlan (switch by changing one import)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from onnx_prepared.errors import InvalidFeedError, ModelLoadError
from onnx_prepared.model import ExternalDataReader, LoadedModel, load_model
from onnx_prepared.model.loader import describe
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

    def __init__(self, path_or_bytes: str | os.PathLike | bytes | onnx.ModelProto,
                 sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, **kwargs: Any) -> None:
        self._options = sess_options or SessionOptions()
        self._model: LoadedModel = _load(path_or_bytes)
        g = self._model.graph
        self._plan: ExecutionPlan = build_execution_plan(g, self._model.opsets, self._model.functions)
        self._reader = ExternalDataReader()
        init_names = set(self._model.weights) | {sp.values.name for sp in g.sparse_initializer}
        self._inputs = [NodeArg(i.name, _shape(i.type), _type_string(i.type)) for i in g.input
                        if i.name not in init_names]
        self._overridable = [NodeArg(i.name, _shape(i.type), _type_string(i.type)) for i in g.input
                             if i.name in init_names]
        self._input_types = {i.name: i.type for i in g.input}
        self._outputs = [NodeArg(o.name, _shape(o.type), _type_string(o.type)) for o in g.output]
        # Issue 2 runtime core: constants are read once at session creation (prepared execution
        # replaces this with overlapped, on-demand reads).
        self._constants = self._plan.new_values()
        for name, s in self._plan.constant_slots.items():
            desc = self._model.weights.get(name)
            if desc is not None:
                self._constants[s] = self._reader.read(desc)
        for sp in g.sparse_initializer:
            self._constants[self._plan.constant_slots[sp.values.name]] = _sparse_to_dense(sp)
        self._slot_of = {n: i for i, n in enumerate(self._plan.slot_names)}
        self._required = [self._plan.slot_names[s] for s in self._plan.input_slots]
        self._output_slot = {o.name: s for o, s in zip(self._outputs, self._plan.output_slots)}
        self._reader.close()

    # ---- onnxruntime-compatible surface ----
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Graph inputs with an initializer default: feeding one overrides the initializer."""
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        m = self._model.model
        return ModelMetadata(m.producer_name, m.graph.name, m.domain, m.doc_string, m.graph.doc_string,
                             m.model_version, {p.key: p.value for p in m.metadata_props})

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list:
        """Outputs named by ``output_names`` (all graph outputs when None), in that order.

        Feeds are checked against the graph's declared types: an unknown or missing name, a wrong
        dtype, rank or fixed dimension raises InvalidFeedError. Sequences are lists, optionals may be
        None. Thread-safe: each call has its own value list.
        """
        plan = self._plan
        for name in self._required:
            if name not in input_feed:
                raise InvalidFeedError(f"missing input {name!r}; expected inputs: {[i.name for i in self._inputs]}")
        if output_names is None:
            out_slots = plan.output_slots
        else:
            try:
                out_slots = [self._output_slot[n] for n in output_names]
            except KeyError as e:
                raise InvalidFeedError(f"unknown output {e.args[0]!r}; outputs: {list(self._output_slot)}") from None
        values = list(self._constants)
        for name, v in input_feed.items():
            tp = self._input_types.get(name)
            if tp is None:
                raise InvalidFeedError(f"unknown input {name!r}; expected inputs: {[i.name for i in self._inputs]}")
            values[self._slot_of[name]] = _check_value(name, tp, v)
        plan.replay(values)
        return [values[s] for s in out_slots]

    def _check_feed(self, name: str, v: Any) -> Any:
        """The stored form of feed ``v`` for input ``name`` (InvalidFeedError when it does not fit)."""
        if name not in self._input_types:
            raise InvalidFeedError(f"unknown input {name!r}; expected inputs: {[i.name for i in self._inputs]}")
        return _check_value(name, self._input_types[name], v)


def _load(source: str | os.PathLike | bytes | onnx.ModelProto) -> LoadedModel:
    """A LoadedModel from a path (metadata-only), serialized bytes or an in-memory ModelProto.

    External data of an in-memory model resolves against the current directory, as onnxruntime does.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(source))
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelLoadError(f"malformed ONNX protobuf in the given bytes: {e}") from None
    elif isinstance(source, onnx.ModelProto):
        model = source
    else:
        return load_model(source)
    if not model.HasField("graph"):
        raise ModelLoadError("the given bytes are not an ONNX model (no graph)")
    base_dir = os.getcwd()
    weights = {t.name: describe(t, base_dir) for t in model.graph.initializer}
    return LoadedModel("<memory>", base_dir, model, MappingProxyType(weights))


def _check_value(name: str, tp: onnx.TypeProto, v: Any) -> Any:
    """``v`` converted to what the plan stores for type ``tp``; InvalidFeedError naming the feed if it cannot."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return _check_tensor(name, tp, v)
    if kind == "sequence_type":
        if not isinstance(v, (list, tuple)):
            raise InvalidFeedError(f"input {name!r} is a sequence; pass a list, not {type(v).__name__}")
        et = tp.sequence_type.elem_type
        return [_check_value(f"{name}[{i}]", et, x) for i, x in enumerate(v)]
    if kind == "optional_type":
        return None if v is None else _check_value(name, tp.optional_type.elem_type, v)
    if kind == "map_type":
        if not isinstance(v, dict):
            raise InvalidFeedError(f"input {name!r} is a map; pass a dict, not {type(v).__name__}")
        return v
    return v  # no declared type: accept as is


def _check_tensor(name: str, tp: onnx.TypeProto, v: Any) -> np.ndarray:
    if v is None:
        raise InvalidFeedError(f"input {name!r} is a tensor; got None")
    arr = v if type(v) is np.ndarray else np.asarray(v)
    et = tp.tensor_type.elem_type
    if et:
        want = _np_dtype(et)
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


@functools.lru_cache(maxsize=64)
def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    from onnx import numpy_helper

    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(indices.T, tuple(sp.dims))
    dense[indices] = values
    return dense.reshape(tuple(sp.dims))
