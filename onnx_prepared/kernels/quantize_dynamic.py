"""DynamicQuantizeLinear and MatMulInteger: the ops of ``onnxruntime.quantization``'s dynamic INT8 models.

DynamicQuantizeLinear follows onnxruntime's CPU kernel: the range is widened to include 0, ``scale =
(max - min) / 255`` (1 when the range is empty), the zero point is ``round_half_even(clamp(-min /
scale, 0, 255))``, and ``y = clamp(round_half_even(x / scale) + zero_point, 0, 255)``, all in float32.

MatMulInteger is exact, as the ONNX spec defines it (the integer product, in int32). With a constant B
(every ``quantize_dynamic`` model) B is prepacked once, centered on its zero point, as int16 pairs and
the native kernel (``_native/qgemm.c``) sums int16 x int16 pair products in int32: exact at every
dispatch level. (onnxruntime's AVX2 U8S8 kernel is not: ``vpmaddubsw`` saturates the int16 sum of two
u8 x s8 products; the tests compare with the integer product there.) Otherwise, and without the
extension, the zero points are subtracted in int32 and the product runs on BLAS in a float type whose
mantissa holds every partial sum (float32 when ``K * max|a| * max|b| < 2**24``, float64 otherwise), so
the int32 result equals the integer one bit for bit.

DynamicQuantizeLinear takes one native call (two passes over x) for finite float32 input, with the same
float32 operations as the numpy code below, which runs without the extension and for NaN or inf.
``onnx_prepared::DynamicQuantizeMatMul`` (resolve/fusions.py's fusion of the whole chain of one MatMul)
with a constant B is one native call too (``dq_matmul_f32``): the same quantization, the same exact
product, and the unfused graph's float32 rescale.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.registry import kernel

_F32_EXACT = float(1 << 24)
_F32 = np.dtype(np.float32)
_INT8 = frozenset({"uint8", "int8"})


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 ``y``, float32 scalar ``y_scale``, uint8 scalar ``y_zero_point``."""
    if x.dtype != np.float32:
        raise KernelError(f"DynamicQuantizeLinear: input must be float32, got {x.dtype}")
    ext = native._ext
    if ext is not None and x.size:
        y = np.empty(x.shape, np.uint8)
        got = ext.dql_u8(np.ascontiguousarray(x), y, x.size)
        if got is not None:  # None: NaN or inf in x, the numpy code below decides
            return y, np.array(got[0], np.float32), np.array(got[1], np.uint8)
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN/inf: as undefined as in onnxruntime, quietly
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
    return (_exact_matmul(a, b),)


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int32 ``a @ b`` of centered int32 operands on BLAS, in a float type that holds every partial sum."""
    k = a.shape[-1]
    bound = float(k) * max(int(np.abs(a).max(initial=0)), 1) * max(int(np.abs(b).max(initial=0)), 1)
    ft = np.float32 if bound < _F32_EXACT else np.float64
    return np.matmul(a.astype(ft), b.astype(ft)).astype(np.int32)


# **** MatMulInteger with a constant B: int16 pairs ****


def pack_b_pairs(b: np.ndarray, b_zero_point: np.ndarray | None = None) -> np.ndarray:
    """``B - b_zero_point`` (int8/uint8 ``[K, N]``, zero point scalar or ``[N]``) as ``qgemm.c``'s layout:
    int16 ``[ceil(K/2), N16, 2]``, element ``[p, n, j] = B[2p + j, n] - zp[n]``, zero past K and N (N16:
    N rounded up to 16); the same bytes at every dispatch level."""
    K, N = b.shape
    c = b.astype(np.int16)
    if b_zero_point is not None:
        if b_zero_point.size not in (1, N):
            raise KernelError(f"MatMulInteger: b_zero_point of shape {list(b_zero_point.shape)} does not match "
                              f"columns ({N})")
        c -= b_zero_point.reshape(-1).astype(np.int16)
    kp, n16 = -(-K // 2), -(-N // 16) * 16
    out = np.zeros((2 * kp, n16), np.int16)
    out[:K, :N] = c
    return np.ascontiguousarray(out.reshape(kp, 2, n16).transpose(0, 2, 1))


def unpack_b_pairs(packed: np.ndarray, K: int, N: int) -> np.ndarray:
    """The centered int32 ``[K, N]`` matrix of a :func:`pack_b_pairs` layout."""
    kp, n16, _ = packed.shape
    return packed.transpose(0, 2, 1).reshape(2 * kp, n16)[:K, :N].astype(np.int32)


def matmul_integer_packed(packed: np.ndarray, A: np.ndarray, a_zero_point: np.ndarray | None = None, *,
                          K: int, N: int) -> tuple[np.ndarray]:
    """int32 ``(A - a_zero_point) @ B_centered`` with B in the :func:`pack_b_pairs` layout; A ``[..., K]``."""
    char = A.dtype.char  # (one attribute read: this runs once per quantized MatMul of every run)
    if char != "B" and char != "b":
        raise KernelError(f"MatMulInteger: A must be uint8 or int8, got {A.dtype}")
    shape = A.shape
    if not shape or shape[-1] != K:
        raise KernelError(f"MatMulInteger: A of shape {list(shape)} does not match B [{K}, {N}]")
    ext = native._ext
    if ext is not None and (a_zero_point is None or a_zero_point.size == 1):
        M = A.size // K
        y = np.empty(shape[:-1] + (N,), np.int32)
        ext.qgemm_i16(np.ascontiguousarray(A), int(char == "b"), 0 if a_zero_point is None else a_zero_point.item(),
                      packed, y, native._scratch(4 * M * packed.shape[0]), M, K, N)
        return (y,)
    m = A.shape[-2] if A.ndim >= 2 else 1
    a = _centered(A, _zero_point(a_zero_point, "a", m, A.ndim, row=A.ndim >= 2))
    return (_exact_matmul(a, unpack_b_pairs(packed, K, N)),)


def _b_pairs_plan(node, const_inputs, const_shapes):
    """``(sources, layout, K, N, kp, from_bytes, packed nbytes)`` of a constant int8 B (and zero point) in
    :func:`pack_b_pairs`' layout, shared by MatMulInteger and DynamicQuantizeMatMul; None if B is not one."""
    has_zp = len(node.input) > 3 and bool(node.input[3])
    sources = (1, 3) if has_zp else (1,)
    if not set(sources) <= const_inputs or 0 in const_inputs:
        return None
    shape, dtype = const_shapes[1]
    if len(shape) != 2 or dtype not in _INT8:
        return None
    K, N = shape
    kp, n16 = -(-K // 2), -(-N // 16) * 16

    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(np.int16).reshape(kp, n16, 2)

    layout = f"mmi-b-i16pairs-{dtype}-k{K}-n{N}-zp{int(has_zp)}"
    return sources, layout, K, N, kp, from_bytes, kp * n16 * 4


@prepack_rule("MatMulInteger")
def matmul_integer_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    plan = _b_pairs_plan(node, const_inputs, const_shapes)
    if plan is None:
        return None
    sources, layout, K, N, _, from_bytes, nbytes = plan

    def run(packed: np.ndarray, A: np.ndarray, a_zero_point: np.ndarray | None = None) -> tuple[np.ndarray]:
        return matmul_integer_packed(packed, A, a_zero_point, K=K, N=N)

    return PrepackSpec(sources, layout, pack_b_pairs, run, array_to_bytes, from_bytes, nbytes)


# **** onnx_prepared::DynamicQuantizeMatMul: the whole quantize_dynamic chain of one MatMul ****


def _dequantized(y32: np.ndarray, a_scale: np.ndarray, b_scale: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The chain's float tail, Cast(y32) * (a_scale * b_scale) (+ bias), in the graph's float32 operations."""
    y = y32.astype(np.float32)
    y *= np.multiply(a_scale, b_scale, dtype=np.float32)
    if bias is not None:
        y += bias
    return y


@kernel("DynamicQuantizeMatMul", since=1, domain="onnx_prepared")
def dynamic_quantize_matmul(A: np.ndarray, B: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray | None = None,
                            bias: np.ndarray | None = None) -> tuple[np.ndarray]:
    """DynamicQuantizeLinear(A), MatMulInteger with B, Cast to float, the scale product (+ bias):
    resolve/fusions.py's fusion of ``quantize_dynamic``'s chain, the same values as the unfused nodes."""
    q, s, zp = dynamic_quantize_linear(A)
    (y32,) = matmul_integer(q, B, zp, b_zero_point)
    return (_dequantized(y32, s, b_scale, bias),)


@prepack_rule("DynamicQuantizeMatMul", domain="onnx_prepared")
def dynamic_quantize_matmul_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    """B (and its zero point) packed as MatMulInteger's (:func:`pack_b_pairs`, the same layout key)."""
    plan = _b_pairs_plan(node, const_inputs, const_shapes)
    if plan is None:
        return None
    sources, layout, K, N, kp, from_bytes, nbytes = plan

    def run(packed: np.ndarray, A: np.ndarray, b_scale: np.ndarray, bias: np.ndarray | None = None) -> tuple:
        ext = native._ext
        shape = A.shape
        # dtype identity: numpy's builtin dtypes are singletons, and `is` costs half of `==` (once per
        # quantized MatMul of every run)
        if (ext is not None and A.dtype is _F32 and shape and shape[-1] == K and b_scale.dtype is _F32
                and b_scale.size in (1, N) and (bias is None or (bias.dtype is _F32 and bias.size == N))):
            M = A.size // K
            y = np.empty(shape[:-1] + (N,), _F32)
            c = np.ascontiguousarray
            if ext.dq_matmul_f32(c(A), packed, c(b_scale), bias if bias is None else c(bias), y,
                                 native._scratch(M * (K + 4 * kp) + 128), M, K, N):
                return (y,)
        q, s, zp = dynamic_quantize_linear(A)
        (y32,) = matmul_integer_packed(packed, q, zp, K=K, N=N)
        return (_dequantized(y32, s, b_scale, bias),)

    return PrepackSpec(sources, layout, pack_b_pairs, run, array_to_bytes, from_bytes, nbytes)
