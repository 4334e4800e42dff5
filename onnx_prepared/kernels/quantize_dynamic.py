"""DynamicQuantizeLinear and MatMulInteger: the ops of ``onnxruntime.quantization``'s dynamic INT8 models.

DynamicQuantizeLinear follows onnxruntime's CPU kernel: the range is widened to include 0, ``scale =
(max - min) / 255`` (1 when the range is empty), the zero point is ``round_half_even(clamp(-min /
scale, 0, 255))``, and ``y = clamp(round_half_even(x / scale) + zero_point, 0, 255)``, all in float32.

MatMulInteger is exact: the zero points are subtracted in int32 and the product runs on BLAS in a float
type whose mantissa holds every partial sum (float32 when ``K * max|a| * max|b| < 2**24``, float64
otherwise), so the int32 result equals the integer one bit for bit.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.registry import kernel

_F32_EXACT = float(1 << 24)


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 ``y``, float32 scalar ``y_scale``, uint8 scalar ``y_zero_point``."""
    if x.dtype != np.float32:
        raise KernelError(f"DynamicQuantizeLinear: input must be float32, got {x.dtype}")
    lo = min(float(x.min()), 0.0) if x.size else 0.0
    hi = max(float(x.max()), 0.0) if x.size else 0.0
    lo32, hi32 = np.float32(lo), np.float32(hi)
    scale = np.float32(1.0) if hi32 == lo32 else np.float32((hi32 - lo32) / np.float32(255.0))
    zp = np.rint(np.clip(np.float32(0.0) - lo32 / scale, np.float32(0.0), np.float32(255.0)))
    q = np.divide(x, scale, dtype=np.float32)
    np.rint(q, out=q)
    q += zp
    np.clip(q, 0.0, 255.0, out=q)
    return q.astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)


def _zero_point(zp: np.ndarray | None, which: str, axis_len: int, ndim: int, row: bool) -> np.ndarray | None:
    """The zero point shaped to broadcast against A (per row: ``[M, 1]``) or B (per column: ``[N]``)."""
    if zp is None:
        return None
    if zp.size == 1:
        return zp.reshape(()).astype(np.int32)
    if zp.ndim == 1 and zp.shape[0] == axis_len:
        return zp.astype(np.int32).reshape((axis_len, 1) if row else (axis_len,))
    if zp.ndim == ndim:
        return zp.astype(np.int32)
    raise KernelError(f"MatMulInteger: {which}_zero_point of shape {list(zp.shape)} does not match "
                      f"{'rows' if row else 'columns'} ({axis_len})")


def _centered(v: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    c = v.astype(np.int32)
    if zp is not None:
        c -= zp
    return c


@kernel("MatMulInteger", since=10)
def matmul_integer(
    A: np.ndarray, B: np.ndarray, a_zero_point: np.ndarray | None = None, b_zero_point: np.ndarray | None = None,
) -> tuple[np.ndarray]:
    """int32 ``(A - a_zero_point) @ (B - b_zero_point)`` with numpy matmul broadcasting."""
    for name, v in (("A", A), ("B", B)):
        if v.dtype not in (np.uint8, np.int8):
            raise KernelError(f"MatMulInteger: {name} must be uint8 or int8, got {v.dtype}")
    if A.ndim == 0 or B.ndim == 0:
        raise KernelError("MatMulInteger: A and B must have rank >= 1")
    m = A.shape[-2] if A.ndim >= 2 else 1
    a = _centered(A, _zero_point(a_zero_point, "a", m, A.ndim, row=A.ndim >= 2))
    b = _centered(B, _zero_point(b_zero_point, "b", B.shape[-1], B.ndim, row=False))
    k = A.shape[-1]
    bound = float(k) * max(int(np.abs(a).max(initial=0)), 1) * max(int(np.abs(b).max(initial=0)), 1)
    ft = np.float32 if bound < _F32_EXACT else np.float64
    y = np.matmul(a.astype(ft), b.astype(ft))
    return (y.astype(np.int32),)
