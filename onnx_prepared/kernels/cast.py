"""Cast and CastLike: ``astype`` with ONNX's float8 saturation and string rules.

Exotic element types (bfloat16, float8 variants, int4/uint4, int2/uint2, float4) are the ml_dtypes
scalar types that ``onnx.helper.tensor_dtype_to_np_dtype`` names, so ``astype`` converts them with
round-to-nearest-even. ``saturate`` (opset 19) only changes float8 targets: out-of-range values clamp
to the largest finite value instead of becoming inf/NaN. A cast to the input's own dtype returns the
input unchanged (no copy).
"""

from __future__ import annotations

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.kernels.registry import kernel, specializes

_FLOAT8 = frozenset({
    onnx.TensorProto.FLOAT8E4M3FN,
    onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2,
    onnx.TensorProto.FLOAT8E5M2FNUZ,
})
_E8M0 = getattr(onnx.TensorProto, "FLOAT8E8M0", -1)


def _cast(x: np.ndarray, to: int, saturate: int, round_mode: str) -> np.ndarray:
    if to == onnx.TensorProto.STRING:
        if x.dtype == object:
            return x
        return x.astype(np.str_).astype(object)
    dtype = onnx.tensor_dtype_to_np_dtype(to)
    if x.dtype == dtype:
        return x
    if to in _FLOAT8 and saturate:
        return np.asarray(onnx.numpy_helper.saturate_cast(x, dtype))  # 0-d inputs come back as scalars
    if to == _E8M0:
        # NOTE: onnx's converter indexes into its masks, which fails for 0-d inputs: convert flat.
        flat = onnx.numpy_helper.to_float8e8m0(x.reshape(-1), bool(saturate), round_mode)
        return flat.astype(dtype).reshape(x.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x.astype(dtype))


@kernel("Cast", since=6)
def cast(x: np.ndarray, *, to: int, saturate: int = 1, round_mode: str = "up") -> tuple[np.ndarray]:
    """``to`` is an ONNX TensorProto element type; ``round_mode`` (opset 24) only affects float8e8m0."""
    return (_cast(x, to, saturate, round_mode),)


@specializes(cast)
def _cast_bound(consts: dict, n_inputs: int, *, to: int, saturate: int = 1, round_mode: str = "up"):
    """A plain numeric target (not string, float8 or e8m0): its numpy dtype once, and the error state
    set only for a float source (the one that can overflow or be NaN), not on every call."""
    if to == onnx.TensorProto.STRING or to in _FLOAT8 or to == _E8M0:
        return None
    try:
        dtype = onnx.tensor_dtype_to_np_dtype(to)
    except Exception:
        return None  # an unknown type: the kernel's own call reports it when the node runs

    def cast_to(x: np.ndarray) -> tuple[np.ndarray]:
        if x.dtype == dtype:
            return (x,)
        if x.dtype.kind in "fc":
            with np.errstate(invalid="ignore", over="ignore"):
                return (np.asarray(x.astype(dtype)),)
        return (np.asarray(x.astype(dtype)),)

    return cast_to


@kernel("CastLike", since=15)
def cast_like(x: np.ndarray, like: np.ndarray, *, saturate: int = 1, round_mode: str = "up") -> tuple[np.ndarray]:
    to = onnx.TensorProto.STRING if like.dtype == object else onnx.np_dtype_to_tensor_dtype(like.dtype)
    return (_cast(x, to, saturate, round_mode),)
