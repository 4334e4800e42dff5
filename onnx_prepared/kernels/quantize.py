"""DequantizeLinear and QuantizeLinear: per-tensor, per-axis and blocked (opset 21 ``block_size``).

Quantized values may be int8/uint8/int16/uint16, the ml_dtypes sub-byte types (int4, uint4, int2,
uint2, float4_e2m1fn) that ``onnx.numpy_helper.to_array`` and our reader produce, or float8. As in the
reference, dequantization computes ``(x - zero_point) * scale`` in float32 and casts to the scale's
dtype (or ``output_dtype``). Blocked parameters are applied through a reshaped view of the work buffer
((..., blocks, block_size, ...) against (..., blocks, 1, ...)) instead of materializing the repeated
scale, when the block size divides the axis.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.kernels.registry import kernel

_FLOAT8 = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})
#: Float quantized types whose zero point is ignored (it must be zero, or does not exist).
_NO_ZERO_POINT = _FLOAT8 | {"float4_e2m1fn"}

_INT_RANGES = {
    onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT8: (-128, 127),
    onnx.TensorProto.UINT16: (0, 65535),
    onnx.TensorProto.INT16: (-32768, 32767),
    onnx.TensorProto.UINT4: (0, 15),
    onnx.TensorProto.INT4: (-8, 7),
    onnx.TensorProto.UINT2: (0, 3),
    onnx.TensorProto.INT2: (-2, 1),
}
_FLOAT8_TYPES = frozenset({
    onnx.TensorProto.FLOAT8E4M3FN,
    onnx.TensorProto.FLOAT8E4M3FNUZ,
    onnx.TensorProto.FLOAT8E5M2,
    onnx.TensorProto.FLOAT8E5M2FNUZ,
})


def _apply(y: np.ndarray, param: np.ndarray, axis: int, block_size: int, op: np.ufunc) -> None:
    """``op(y, param, out=y)`` with ``param`` laid out per tensor, per axis or per block along ``axis``."""
    if param.ndim == 0 or param.size == 1:
        op(y, param.reshape(()), out=y)
        return
    axis = axis + y.ndim if axis < 0 else axis
    if not 0 <= axis < y.ndim:
        raise ValueError(f"quantization axis {axis} is out of range for rank {y.ndim}")
    if not block_size:
        if param.ndim != 1 or param.size != y.shape[axis]:
            raise ValueError(f"per-axis parameter of shape {param.shape} does not match axis {axis} of {y.shape}")
        dims = [1] * y.ndim
        dims[axis] = param.size
        op(y, param.reshape(dims), out=y)
        return
    if block_size < 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    dim = y.shape[axis]
    blocks = -(-dim // block_size)
    expected = y.shape[:axis] + (blocks,) + y.shape[axis + 1:]
    if param.shape != expected:
        raise ValueError(f"blocked parameter of shape {param.shape} does not match {expected} "
                         f"(input {y.shape}, axis {axis}, block_size {block_size})")
    if dim % block_size == 0:
        yv = y.reshape(y.shape[:axis] + (blocks, block_size) + y.shape[axis + 1:])  # a view: y is contiguous
        op(yv, np.expand_dims(param, axis + 1), out=yv)
        return
    full = np.repeat(param, block_size, axis=axis)
    op(y, full.take(np.arange(dim), axis=axis), out=y)


@kernel("DequantizeLinear", since=10)
def dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> tuple[np.ndarray]:
    """``(x - x_zero_point) * x_scale``; float8/float4 inputs ignore the (zero) zero point."""
    y = x.astype(np.float32)
    if y.ndim == 0:
        y = y.reshape(1)  # ufunc out= needs an array; restored below
    if x_zero_point is not None and x.dtype.name not in _NO_ZERO_POINT:
        _apply(y, x_zero_point.astype(np.float32), axis, block_size, np.subtract)
    _apply(y, x_scale.astype(np.float32, copy=False), axis, block_size, np.multiply)
    dtype = onnx.tensor_dtype_to_np_dtype(output_dtype) if output_dtype else x_scale.dtype
    y = y.reshape(x.shape)
    return (y if y.dtype == dtype else y.astype(dtype),)


@kernel("QuantizeLinear", since=10)
def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    saturate: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
) -> tuple[np.ndarray]:
    """``saturate(round_half_even(x / y_scale) + y_zero_point)`` in the zero point's type (default uint8)."""
    if y_zero_point is not None:
        to = onnx.np_dtype_to_tensor_dtype(y_zero_point.dtype)
        if output_dtype and output_dtype != to:
            raise ValueError(f"QuantizeLinear output_dtype {output_dtype} differs from the zero point's type {to}")
    else:
        to = output_dtype or onnx.TensorProto.UINT8
    work = onnx.tensor_dtype_to_np_dtype(precision) if precision else np.result_type(x.dtype, y_scale.dtype)
    y = np.array(x, dtype=work, copy=True)
    if y.ndim == 0:
        y = y.reshape(1)
    _apply(y, y_scale.astype(work, copy=False), axis, block_size, np.divide)
    dtype = onnx.tensor_dtype_to_np_dtype(to)
    if to in _INT_RANGES:
        np.rint(y, out=y)
        if y.dtype.itemsize >= 4:  # saturate as MLAS does (in float) before the int32 cast; NaN stays NaN
            np.clip(y, -(1 << 20), 1 << 20, out=y)
        q = y.astype(np.int32)
        if y_zero_point is not None:
            _apply(q, y_zero_point.astype(np.int32), axis, block_size, np.add)
        lo, hi = _INT_RANGES[to]
        np.clip(q, lo, hi, out=q)
        return (q.astype(dtype).reshape(x.shape),)
    if to in _FLOAT8_TYPES:
        q = onnx.numpy_helper.saturate_cast(y, dtype) if saturate else y.astype(dtype)
        return (q.reshape(x.shape),)
    if dtype.name == "float4_e2m1fn":
        if y_zero_point is not None:
            _apply(y, y_zero_point.astype(work), axis, block_size, np.add)
        return (y.astype(dtype).reshape(x.shape),)
    raise ValueError(f"QuantizeLinear cannot produce element type {onnx.TensorProto.DataType.Name(to)}")
