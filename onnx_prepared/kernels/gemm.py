"""Gemm and MatMul on numpy's BLAS-backed matmul.

Transposes are views (``b.T``), so BLAS reads the transposed layout without a copy. Half-precision
inputs (float16, bfloat16) are multiplied in float32 and cast back: numpy has no BLAS path for them,
and float32 accumulation is at least as accurate as the reference.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.registry import kernel, specializes

#: dtypes numpy cannot hand to BLAS; computed in float32 and cast back.
_HALF = frozenset({"float16", "bfloat16"})


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.itemsize == 2 and a.dtype.name in _HALF:  # dtype.name costs ~1.5 us: sized first
        return np.asarray(np.matmul(a.astype(np.float32), b.astype(np.float32)))
    return np.asarray(np.matmul(a, b))


@kernel("MatMul", since=1)
def matmul(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    """``np.matmul`` semantics, 1-D operands included (a 1-D @ 1-D product is a 0-d array)."""
    y = _matmul(a, b)
    return (y if y.dtype == a.dtype else y.astype(a.dtype),)


@kernel("Gemm", since=7)
def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> tuple[np.ndarray]:
    """``alpha * A' @ B' + beta * C`` with C unidirectionally broadcast (optional from opset 11).

    A and B must be 2-D (as onnxruntime requires): ``np.matmul`` would also take a 1-D operand and
    compute a product the model does not describe (a Gemm missing its A ran with A=B, B=C).
    """
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError(f"Gemm: A and B must be 2-D, got shapes {list(a.shape)} and {list(b.shape)}")
    if b.dtype != a.dtype or (c is not None and c.dtype != a.dtype):
        # ONNX's one type T for A, B and C (onnxruntime refuses a mix); numpy would promote silently
        raise KernelError(f"Gemm: A, B and C must have one element type, got {a.dtype}, {b.dtype} and "
                          f"{None if c is None else c.dtype}")
    dtype = a.dtype
    y = _matmul(a.T if transA else a, b.T if transB else b)  # a fresh array: safe to update in place
    if y.dtype.kind in "iu" and (alpha != 1.0 or (c is not None and beta != 1.0)):
        # Integer Gemm with fractional coefficients: compute like the reference, then cast back.
        out = y * alpha
        if c is not None and beta != 0.0:
            out = out + c * beta
        return (out.astype(dtype),)
    if alpha != 1.0:
        y *= alpha
    if c is not None and beta != 0.0:
        if beta == 1.0:
            y += c
        else:
            y += c * np.asarray(beta, dtype=c.dtype)
    return (y if y.dtype == dtype else y.astype(dtype),)


@specializes(gemm)
def _gemm_bound(consts: dict, n_inputs: int, *, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,
                transB: int = 0):
    """Gemm with alpha = beta = 1 on float32 2-D operands: the transposes settled at binding and the
    kernel's checks reduced to one type test per operand (a Gemm whose B is not constant, e.g. in a
    Loop body reading an outer-scope weight: 9.4 -> ~6 us on [3, 4] x [4, 4]). Anything else calls the
    kernel, whose checks and messages stay as they are."""
    attrs = {"alpha": alpha, "beta": beta, "transA": transA, "transB": transB}
    if alpha != 1.0 or beta != 1.0:
        return None
    f32 = np.dtype(np.float32)

    def gemm_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> tuple[np.ndarray]:
        if (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == f32 and b.dtype == f32 and a.ndim == 2
                and b.ndim == 2 and (c is None or (type(c) is np.ndarray and c.dtype == f32))):
            y = np.matmul(a.T if transA else a, b.T if transB else b)
            if c is not None:
                y += c
            return (y,)
        return gemm(a, b, c, **attrs)

    return gemm_f32
