"""Values crossing the runtime boundary: feed checks against declared types, and ONNX type strings."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnx_prepared.errors import InvalidFeedError


def type_string(tp: onnx.TypeProto) -> str:
    if tp.HasField("tensor_type"):
        np_t = helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type) if tp.tensor_type.elem_type else None
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
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return []
    out = []
    for d in tp.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
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
                                   f"the model expects rank {len(dims)} ({shape_of(tp)})")
        for i, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value != arr.shape[i]:
                raise InvalidFeedError(f"input {name!r} has shape {list(arr.shape)}, the model expects "
                                       f"{shape_of(tp)} (dimension {i})")
    return arr


@functools.lru_cache(maxsize=64)
def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    from onnx import numpy_helper

    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(indices.T, tuple(sp.dims))
    dense[indices] = values
    return dense.reshape(tuple(sp.dims))
