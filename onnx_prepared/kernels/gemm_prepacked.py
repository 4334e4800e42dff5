"""Prepacked Gemm and MatMul with a constant B: B is stored once as a contiguous [K, N] panel.

Packing folds ``transB`` and ``alpha`` into the panel, so the hot kernel is one BLAS call plus the
bias. Both fold into the layout key: transB 0 and 1 of the same B are two prepared objects.
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule


def pack_gemm_b(b: np.ndarray, *, trans_b: int, alpha: float) -> np.ndarray:
    """[K, N] contiguous panel of alpha * op(B)."""
    panel = b.T if trans_b else b
    if alpha != 1.0:
        return np.ascontiguousarray(panel * np.asarray(alpha, dtype=b.dtype))
    return np.ascontiguousarray(panel)


def gemm_packed(packed: np.ndarray, a: np.ndarray, c: np.ndarray | None = None, *,
                trans_a: int = 0, beta: float = 1.0) -> tuple:
    if a.ndim != 2:  # as gemm(): a 1-D A would broadcast into a product the model does not describe
        raise KernelError(f"Gemm: A must be 2-D, got shape {list(a.shape)}")
    if a.dtype != packed.dtype or (c is not None and c.dtype != a.dtype):  # one type T, as in gemm()
        raise KernelError(f"Gemm: A, B and C must have one element type, got {a.dtype}, {packed.dtype} and "
                          f"{None if c is None else c.dtype}")
    y = (a.T if trans_a else a) @ packed
    if c is not None and beta != 0.0:
        y += c if beta == 1.0 else c * np.asarray(beta, dtype=y.dtype)
    return (y,)


def matmul_packed(packed: np.ndarray, a: np.ndarray) -> tuple:
    return (a @ packed,)


def unpack_array(shape: tuple[int, ...], dtype: str):
    """``from_bytes`` of a packed payload that is the C-contiguous array of ``shape`` and ``dtype``."""
    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(np.dtype(dtype)).reshape(shape)

    return from_bytes


@prepack_rule("Gemm")
def gemm_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if 1 not in const_inputs or len(const_shapes.get(1, ((),))[0]) != 2:
        return None
    (shape, dtype) = const_shapes[1]
    if dtype not in ("float32", "float64"):
        return None
    trans_b, alpha = int(attrs.get("transB", 0)), float(attrs.get("alpha", 1.0))
    k, n = (shape[1], shape[0]) if trans_b else shape
    layout = f"gemm-b-kn-{dtype}-k{k}-n{n}-transB{trans_b}-alpha{alpha!r}"
    return PrepackSpec(
        (1,), layout, functools.partial(pack_gemm_b, trans_b=trans_b, alpha=alpha),
        functools.partial(gemm_packed, trans_a=int(attrs.get("transA", 0)), beta=float(attrs.get("beta", 1.0))),
        array_to_bytes, unpack_array((k, n), dtype),
    )


@prepack_rule("MatMul")
def matmul_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if 1 not in const_inputs or 0 in const_inputs:
        return None
    shape, dtype = const_shapes[1]
    if len(shape) != 2 or dtype not in ("float32", "float64"):
        return None
    layout = f"matmul-b-kn-{dtype}-k{shape[0]}-n{shape[1]}"
    return PrepackSpec((1,), layout, np.ascontiguousarray, matmul_packed, array_to_bytes, unpack_array(shape, dtype))
