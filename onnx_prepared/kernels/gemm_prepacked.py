"""Prepacked Gemm and MatMul with a constant B: B is stored once as a contiguous [K, N] panel, or, for a
float32 Gemm when the extension is built, as ``sgemm_packed``'s 16-row panels of ``op(B)^T`` (layout
``gemm-b-p16``: :class:`PanelGemm`).

Packing folds ``transB`` and ``alpha`` into the panel, so the hot kernel is one BLAS call plus the
bias. Both fold into the layout key: transB 0 and 1 of the same B are two prepared objects.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
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


def pack_gemm_panels(b: np.ndarray, *, trans_b: int, alpha: float) -> np.ndarray:
    """``alpha * op(B)^T`` ([N, K]) in ``native.pack_panels``' layout ``[1, ceil(N/16), K, 16]``."""
    return native.pack_panels(pack_gemm_b(b, trans_b=trans_b, alpha=alpha).T[None])


class PanelGemm:
    """A float32 Gemm on the panels of ``op(B)^T``: ``y^T = op(B)^T @ op(A)^T`` is one ``sgemm_packed`` call
    whose columns are A's rows, with C added in its epilogue when it is a per-column bias ([N] or [1, N]):
    on a CNN head's one row (M = 1, the columns are contiguous both ways) the whole Gemm is one native
    call (bn_cnn's [1, 32] x [32, 5]: 6.2 -> ~2 us; MobileNetV3's [1, 576] x [576, 1024] runs on every
    core instead of OpenBLAS' one thread). Other rows count pay a transposing copy of A and of the output.
    Other dtypes, an empty product and the numpy fallback (no extension) go through :func:`gemm_packed`
    on the unpacked ``[K, N]`` matrix."""

    __slots__ = ("_plans", "beta", "k", "n", "trans_a")

    def __init__(self, n: int, k: int, *, trans_a: int, beta: float):
        self.n, self.k, self.trans_a, self.beta = n, k, trans_a, beta
        self._plans: dict = {}

    def __call__(self, packed: np.ndarray, a: np.ndarray, c: np.ndarray | None = None) -> tuple:
        plan = self._plans.get(a.shape)
        if plan is None or plan[0] is not native._ext or plan[1] is not a.dtype or plan[2] is not c:
            plan = self._plan(a, c)
            if plan is None:
                return self._general(packed, a, c)
        return (plan[3](packed, a),)

    def _plan(self, a: np.ndarray, c: np.ndarray | None):
        """``(ext, a's dtype, c, call)`` for A's shape and this C (the call allocates the output and makes the
        one extension call), kept per A shape; None when the general path takes it."""
        ext, n, k, beta = native._ext, self.n, self.k, self.beta
        if ext is None or a.dtype != np.float32 or a.ndim != 2 or (c is not None and c.dtype != np.float32):
            return None
        m = a.shape[0 if not self.trans_a else 1]
        if a.shape[1 if not self.trans_a else 0] != k or not m:
            return None
        bias, rest = None, c if beta != 0.0 else None
        if rest is not None and rest.size == n and rest.shape[-1:] == (n,) and rest.ndim <= 2:
            bias, rest = np.ascontiguousarray(rest.reshape(n) * np.float32(beta), np.float32), None
        elif rest is not None and beta != 1.0:
            rest = rest * np.float32(beta)
        dims = np.array([1, n, k, m, 1], np.int64)
        trans_a, inf = self.trans_a, np.inf

        def call(packed: np.ndarray, a: np.ndarray) -> np.ndarray:
            at = a if trans_a else a.T  # [K, M]: the product's columns (a row is a column as it is)
            yt = np.empty((n, m), np.float32)
            ext.sgemm_packed(packed, at if at.flags.c_contiguous else np.ascontiguousarray(at), yt, bias, dims, -inf,
                             inf, 0)
            y = yt.reshape(1, n) if m == 1 else np.ascontiguousarray(yt.T)
            if rest is not None:
                y += rest
            return y

        plan = (ext, a.dtype, c, call)
        self._plans[a.shape] = plan
        return plan

    def _general(self, packed: np.ndarray, a: np.ndarray, c: np.ndarray | None) -> tuple:
        kn = native.unpack_panels(packed, self.n)[0].T
        return gemm_packed(np.ascontiguousarray(kn), a, c, trans_a=self.trans_a, beta=self.beta)


@prepack_rule("Gemm")
def gemm_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if 1 not in const_inputs or len(const_shapes.get(1, ((),))[0]) != 2:
        return None
    (shape, dtype) = const_shapes[1]
    if dtype not in ("float32", "float64"):
        return None
    trans_b, alpha = int(attrs.get("transB", 0)), float(attrs.get("alpha", 1.0))
    k, n = (shape[1], shape[0]) if trans_b else shape
    if dtype == "float32" and native.available() and k >= 1 and n >= 1:
        pshape = (1, -(-n // native.SG_PANEL), k, native.SG_PANEL)
        return PrepackSpec(
            (1,), f"gemm-b-p16-float32-k{k}-n{n}-transB{trans_b}-alpha{alpha!r}",
            functools.partial(pack_gemm_panels, trans_b=trans_b, alpha=alpha),
            PanelGemm(n, k, trans_a=int(attrs.get("transA", 0)), beta=float(attrs.get("beta", 1.0))),
            array_to_bytes, unpack_array(pshape, dtype), packed_bytes=math.prod(pshape) * 4,
        )
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
