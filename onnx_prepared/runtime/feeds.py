"""Values crossing the runtime boundary: feed binding and checks against declared types, ONNX type strings."""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import InvalidFeedError

if TYPE_CHECKING:
    from onnx_prepared.bind import ExecutionPlan


class FeedBinder:
    """Checks a run's feeds and places them in a fresh slot list (read-only after construction).

    Each input's check is compiled once: a plain ndarray of the declared dtype, rank and fixed dims is
    stored as is after a few comparisons; anything else goes through :func:`check_value`, which
    converts it or raises the InvalidFeedError naming what is wrong.
    """

    def __init__(self, execution: ExecutionPlan, graph: onnx.GraphProto, requirement_slots: tuple[int, ...]) -> None:
        slot_of = {n: i for i, n in enumerate(execution.slot_names)}
        self.required = [execution.slot_names[s] for s in execution.input_slots]
        # slots holding prepared requirements: a feed there overrides an initializer-backed input
        bit_of_slot = {s: b for b, s in enumerate(requirement_slots) if s >= 0}
        # name -> (slot, required, requirement bit or None, TypeProto, fast-path dtype or None, rank or -1,
        # getter of the fixed dims from a shape or None, those dims as it returns them)
        required = set(self.required)
        self._inputs: dict[str, tuple] = {}
        for i in graph.input:
            slot = slot_of[i.name]
            self._inputs[i.name] = (slot, i.name in required, bit_of_slot.get(slot), i.type, *_fast_check(i.type))
        # Values that are part of the plan itself, not weights: folded Constant nodes (ExecutionPlan.presets)
        # and sparse initializers (inline, tiny).
        self._constants = execution.new_values()
        for sp in graph.sparse_initializer:
            if sp.values.name in slot_of:
                self._constants[slot_of[sp.values.name]] = sparse_to_dense(sp)

    def bind(self, feeds: Mapping[str, Any]) -> tuple[list, frozenset[int]]:
        """A fresh value list with the checked feeds, and the requirement bits the caller overrode."""
        values = list(self._constants)
        inputs = self._inputs
        overridden = []
        n_required = 0
        for name, v in feeds.items():
            spec = inputs.get(name)
            if spec is None:
                raise InvalidFeedError(f"unknown input {name!r}; expected inputs: {self.required}")
            slot, req, bit, tp, want, rank, dims_of, dims = spec
            if (want is not None and type(v) is np.ndarray and v.dtype == want
                    and (rank < 0 or (v.ndim == rank and (dims_of is None or dims_of(v.shape) == dims)))):
                values[slot] = v
            else:
                values[slot] = check_value(name, tp, v)
            n_required += req
            if bit is not None:  # an initializer-backed input the caller overrides
                overridden.append(bit)
        if n_required != len(self.required):
            for name in self.required:
                if name not in feeds:
                    raise InvalidFeedError(f"missing input {name!r}; expected inputs: {self.required}")
        return values, frozenset(overridden)


def _fast_check(tp: onnx.TypeProto) -> tuple[np.dtype | None, int, Any, Any]:
    """(dtype, rank or -1 without a shape, fixed dims getter, fixed dims) a tensor feed passes as is: the
    getter (an itemgetter over the fixed axes, None when no axis is fixed) returns the dims to compare in
    one C call, no generator over the axes (~0.3 us a feed). dtype None for anything that always takes
    :func:`check_value` (sequences, optionals, maps, untyped tensors)."""
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.elem_type:
        return None, -1, None, ()
    want = _np_dtype(tp.tensor_type.elem_type)
    if not tp.tensor_type.HasField("shape"):
        return want, -1, None, ()
    dims = tp.tensor_type.shape.dim
    fixed = [(i, d.dim_value) for i, d in enumerate(dims) if d.HasField("dim_value") and d.dim_value >= 0]
    if not fixed:
        return want, len(dims), None, ()
    shape = [0] * len(dims)
    for i, d in fixed:
        shape[i] = d
    get = operator.itemgetter(*(i for i, _ in fixed))
    return want, len(dims), get, get(shape)


def type_string(tp: onnx.TypeProto) -> str:
    if tp.HasField("tensor_type"):
        np_t = onnx.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type) if tp.tensor_type.elem_type else None
        return f"tensor({_ORT_TYPE.get(np.dtype(np_t).name, np.dtype(np_t).name) if np_t is not None else 'undefined'})"
    if tp.HasField("sequence_type"):
        return f"seq({type_string(tp.sequence_type.elem_type)})"
    if tp.HasField("optional_type"):
        return f"optional({type_string(tp.optional_type.elem_type)})"
    if tp.HasField("map_type"):
        return "map"
    return "unknown"


_ORT_TYPE = {"float32": "float", "float64": "double", "object": "string", "bool": "bool"}


def shape_of(tp: onnx.TypeProto) -> list:
    """onnxruntime's shape list: ints, symbolic names, None for unknown dims (a negative ``dim_value``, as
    paddle2onnx writes dynamic dims, is unknown too); [] when the type has no shape."""
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return []
    out = []
    for d in tp.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value if d.dim_value >= 0 else None)
        else:
            out.append(d.dim_param or None)
    return out


def check_value(name: str, tp: onnx.TypeProto, v: Any) -> Any:
    """``v`` converted to what the plan stores for type ``tp``; InvalidFeedError naming the feed if it cannot."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return _check_tensor(name, tp, v)
    if kind == "sequence_type":
        if not isinstance(v, (list, tuple)):
            raise InvalidFeedError(f"input {name!r} is a sequence; pass a list, not {type(v).__name__}")
        et = tp.sequence_type.elem_type
        return [check_value(f"{name}[{i}]", et, x) for i, x in enumerate(v)]
    if kind == "optional_type":
        return None if v is None else check_value(name, tp.optional_type.elem_type, v)
    if kind == "map_type":
        if not isinstance(v, dict):
            raise InvalidFeedError(f"input {name!r} is a map; pass a dict, not {type(v).__name__}")
        return v
    return v  # no declared type: accept as is


def _check_tensor(name: str, tp: onnx.TypeProto, v: Any) -> np.ndarray:
    if v is None:
        raise InvalidFeedError(f"input {name!r} is a tensor; got None")
    et = tp.tensor_type.elem_type
    if type(v) is np.ndarray:
        arr = v
    elif isinstance(v, np.ndarray):  # a subclass (np.matrix, memmap): its data as a plain array
        arr = np.asarray(v)
    else:  # list, tuple, Python or numpy scalar: converted to the declared type, as onnxruntime does
        arr = _convert(name, v, _np_dtype(et) if et else None)
    if et:
        want = _np_dtype(et)
        if arr.dtype != want and not (want.kind == "O" and arr.dtype.kind in "OUS"):
            raise InvalidFeedError(f"input {name!r} has dtype {arr.dtype}, the model expects {want}")
    if tp.tensor_type.HasField("shape"):
        dims = tp.tensor_type.shape.dim
        if arr.ndim != len(dims):
            raise InvalidFeedError(f"input {name!r} has rank {arr.ndim} (shape {list(arr.shape)}), "
                                   f"the model expects rank {len(dims)} ({shape_of(tp)})")
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != arr.shape[i]:
                raise InvalidFeedError(f"input {name!r} has shape {list(arr.shape)}, the model expects "
                                       f"{shape_of(tp)} (dimension {i})")
    return arr


def _convert(name: str, v: Any, want: np.dtype | None) -> np.ndarray:
    """A non-ndarray feed as an array of the declared type ``want``; InvalidFeedError if that loses
    information (a fraction or out-of-range value to an integer type, an integer a float cannot hold,
    a non-0/1 value to bool, a finite value that overflows). Float to narrower float rounds, as in
    onnxruntime (Python floats are float64)."""
    try:
        arr = np.asarray(v)
    except ValueError as e:  # ragged nesting
        raise InvalidFeedError(f"input {name!r}: cannot make a tensor of {type(v).__name__}: {e}") from None
    if want is None or arr.dtype == want:
        return arr
    if want.kind == "O":
        if arr.dtype.kind in "OUS" or arr.size == 0:
            return arr.astype(object)
        raise InvalidFeedError(f"input {name!r} is a string tensor; got {arr.dtype} values")
    if arr.dtype.kind not in "biuf" or want.kind not in "biufc":
        if arr.size == 0:
            return arr.astype(want)
        raise InvalidFeedError(f"input {name!r}: {arr.dtype} values cannot convert to the declared {want}")
    with np.errstate(all="ignore"):
        out = arr.astype(want)
        if arr.dtype.kind == "f" and want.kind in "fc":
            lossy = bool(np.any(np.isinf(out) & np.isfinite(arr)))
        else:
            back = out.astype(arr.dtype)
            lossy = not bool(np.all((back == arr) | (np.isnan(arr) if arr.dtype.kind == "f" else False)))
            lossy = lossy or (arr.dtype.kind == "f" and want.kind in "biu" and bool(np.any(np.isnan(arr))))
    if lossy:
        raise InvalidFeedError(f"input {name!r}: converting the given {arr.dtype} values to the declared {want} "
                               "would change them; pass an ndarray of that dtype")
    return out


@functools.lru_cache(maxsize=64)
def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(onnx.tensor_dtype_to_np_dtype(elem_type))


def sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = onnx.to_array(sp.values)
    indices = onnx.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(indices.T, tuple(sp.dims))
    dense[indices] = values
    return dense.reshape(tuple(sp.dims))
