"""com.microsoft MatMulNBits: ``Y = A @ dequantize(B) (+ bias)`` with block-wise 2/4/8-bit weights.

Semantics follow onnxruntime's ContribOperators.md. ``B`` is uint8 ``[N, k_blocks, blob_size]``; each
block packs ``block_size`` values of one output column along K, low-order bits first. Dequantized
``W[k, n] = (q[n, k] - zero_point[n, k // block_size]) * scales[n, k // block_size]``; zero points are
absent (``2 ** (bits - 1)``), packed uint8 ``[N, ceil(k_blocks * bits / 8)]`` (each row byte-aligned) or
float ``[N, k_blocks]``. ``scales`` and packed zero points may be flat, as older quantizers wrote them.

**4-bit weights** (what quantizers write) run through the compiled extension
(:mod:`onnx_prepared.kernels.native`, numpy fallback of the same layout without it). Prepack
(:func:`prepack_matmul_nbits`) turns (B, scales, zero points) into a :class:`~._q4_panels.PackedQ4` in
the ``panel16`` layout (:mod:`onnx_prepared.kernels._q4_panels`): no larger than the source when N is a
multiple of 16, no offset array for symmetric weights.

**Accuracy.** Levels 0..3 (and level 4 with float zero points, as onnxruntime does) compute in fp32:
``y = sum_blocks scale * (sum_k a*q - zero_point * sum_k a)``, within fp32 rounding of onnxruntime
(tests: 1e-5 of max|y|). ``accuracy_level=4`` quantizes A per block exactly as onnxruntime's CompInt8
(``scale = amax/127``, ``q = round_half_even(a * (127/amax))``, the block length of B), multiplies in
int32 (VNNI where present) and accumulates in onnxruntime's float order. That order is the one of the
MLAS kernels onnxruntime 1.32 runs on this CPU (:func:`int8_order`: its AVX-512 kernels where the CPU has
AVX-512 F/BW/DQ/VL, else its AVX2 or AVX-VNNI ones), whatever our dispatch level: the native kernels give
its bits exactly at block sizes 16-256 on every dispatch level (``_native/nbits.h``; the numpy fallback
within float rounding). ``ONNX_PREPARED_NBITS_ORDER=avx512|avx2|avx2vnni`` forces one order (tests),
``mlas`` the CPU's; ``fast`` is our own faster order, opt-in: within float rounding of onnxruntime per call,
bit-identical at every dispatch level and thread count, but whole models drift from onnxruntime with it
(:func:`int8_order`).
fp16 inputs are widened to fp32 and the output narrowed back.

**8-bit weights** run on the same kernel as two 4-bit halves (high and low nibbles,
:mod:`onnx_prepared.kernels._q8_split`), at every accuracy level as for 4 bits (level 4: int8 activations).
**2-bit weights** stay on numpy: layout ``matmul-nbits-q2-kmajor-u32-block{block_size}``, ``words`` uint32
``[k_blocks, block_size * bits // 32, N]``, ``scales`` and ``offsets = -zero_point * scale`` float32
``[k_blocks, N]``; B is dequantized to fp32 in panels of K (at most ``PANEL_BYTES``) and multiplied with
BLAS, always in fp32.

The registered kernel (unprepacked B) prepacks on every call: no hidden cache (4 bits:
:func:`matmul_nbits_source`, which also runs a prepacked node's source form while its prepared object is
not resident yet: the native pool's tasks each pack a few panels into their thread's scratch and multiply
them; without the extension, column chunks packed into a reused per-thread scratch). A session's first run and
later runs give bit-identical outputs (nothing warms up). Figures: ``benchmarks/kernels_nbits.py``.
"""

from __future__ import annotations

import functools
import os
import struct
import threading

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _q4_panels as q4
from onnx_prepared.kernels import _q8_split as q8
from onnx_prepared.kernels import native
from onnx_prepared.kernels._int4 import unpack_bits
from onnx_prepared.kernels._q4_panels import PackedQ4
from onnx_prepared.kernels._q8_split import PackedQ8Split, pack_q8_split
from onnx_prepared.kernels.prepack import PrepackSpec, SourceForm, prepack_rule
from onnx_prepared.kernels.registry import kernel
from onnx_prepared.memory.aligned import aligned_empty
from onnx_prepared.records import record

_F32 = np.dtype(np.float32)
#: bytes of one dequantized fp32 panel of B in the BLAS path
PANEL_BYTES = 8 << 20
_SUPPORTED_BITS = (2, 4, 8)


# **** onnxruntime's int8 summation order ****

ORDER_ENV = "ONNX_PREPARED_NBITS_ORDER"
#: native matmul_q4 modes of the int8 orders (``_native/nbits.h`` NB_MODE_I8*): MLAS's on one kind of CPU,
#: or ours ("fast")
INT8_ORDERS = {"avx512": 1, "avx2": 2, "avx2vnni": 3, "fast": 4}


@functools.cache
def _detected_order() -> str:
    """The MLAS kernels onnxruntime picks on this CPU: AVX-512 core (F, BW, DQ, VL), else AVX-VNNI, else AVX2."""
    flags = native.cpu_flags()
    if not flags:  # no /proc/cpuinfo: the extension's levels (AVX-512 without VNNI counts as AVX2 here)
        levels = native.supported_levels()
        return "avx512" if "avx512vnni" in levels else "avx2vnni" if "avx2vnni" in levels else "avx2"
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "avx512"
    return "avx2vnni" if "avx_vnni" in flags else "avx2"


def mlas_order() -> str:
    """The summation order of the MLAS kernels onnxruntime runs on this CPU (its bits, exactly)."""
    return _detected_order()


@functools.cache
def int8_order() -> str:
    """The summation order accuracy_level 4 follows: ``ONNX_PREPARED_NBITS_ORDER`` if set (one of
    :data:`INT8_ORDERS`, or ``mlas``), else the CPU's MLAS order (:func:`mlas_order`, onnxruntime's bits).

    ``fast`` (``_native/nbits.h`` NB_MODE_I8_FAST, opt-in) quantizes A as onnxruntime does and sums each
    block's int32 dot exactly, then one float chain per output over the blocks: within ~1e-6 of onnxruntime
    per call and 1.4-1.7x faster than MLAS's AVX2 order on an AVX2-only CPU (which spends a convert and an fma
    per 8 k values), but not onnxruntime's bits, and whole models do not stay within atol 1e-4 + rtol 1e-3 of
    onnxruntime with it: a last-bit difference in one output flips int8 roundings of the next MatMulNBits'
    activations and deep layers amplify them (measured on tests/kernels/test_gqa_model_exact.py's model, 3
    layers, 128 tokens: 115110 of 131072 logits outside, max 0.013). Hence not the default.

    Read once per process: every level-4 call asks, and looking up an unset variable costs ~2 us (tests
    that set it call ``int8_order.cache_clear()``)."""
    forced = os.environ.get(ORDER_ENV)
    if forced and forced != "mlas":
        if forced not in INT8_ORDERS:
            raise KernelError(f"{ORDER_ENV}={forced!r} is not an int8 order (one of mlas, {', '.join(INT8_ORDERS)})")
        return forced
    return _detected_order()


# **** packed layout ****


@record(frozen=True, slots=True, eq=False)
class PackedNBits:
    """B, scales and zero points of one MatMulNBits node in the k-major layout named by ``layout``."""

    layout: str
    K: int
    N: int
    bits: int
    block_size: int
    #: uint32 [k_blocks, block_size * bits // 32, N]; padding rows past K hold zero
    words: np.ndarray
    #: float32 [k_blocks, N]
    scales: np.ndarray
    #: float32 [k_blocks, N], -zero_point * scale
    offsets: np.ndarray

    @property
    def k_blocks(self) -> int:
        return self.words.shape[0]

    @property
    def nbytes(self) -> int:
        return self.words.nbytes + self.scales.nbytes + self.offsets.nbytes

    def to_bytes(self) -> bytes:
        """One byte payload (for the persisted prepack cache); :meth:`from_bytes` reverses it."""
        head = struct.pack("<4sIqqii", b"MNB1", 1, self.K, self.N, self.bits, self.block_size)
        return head + self.words.tobytes() + self.scales.tobytes() + self.offsets.tobytes()

    @classmethod
    def from_bytes(cls, buf: bytes | memoryview) -> PackedNBits:
        magic, _, K, N, bits, bs = struct.unpack_from("<4sIqqii", buf, 0)
        if magic != b"MNB1":
            raise KernelError("MatMulNBits packed payload has a bad header")
        kb = -(-K // bs)
        off = struct.calcsize("<4sIqqii")
        nw = kb * (bs * bits // 32) * N
        words = np.frombuffer(buf, np.uint32, nw, off).reshape(kb, bs * bits // 32, N)
        scales = np.frombuffer(buf, np.float32, kb * N, off + 4 * nw).reshape(kb, N)
        offsets = np.frombuffer(buf, np.float32, kb * N, off + 4 * nw + 4 * kb * N).reshape(kb, N)
        return cls(layout_key(bits, bs), K, N, bits, bs, words, scales, offsets)


def layout_key(bits: int, block_size: int) -> str:
    """The packed layout's key; it names every parameter that changes the packed bytes."""
    return f"matmul-nbits-q{bits}-kmajor-u32-block{block_size}"


def prepack_matmul_nbits(
    B: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    *,
    K: int,
    N: int,
    bits: int = 4,
    block_size: int,
) -> PackedQ4 | PackedQ8Split | PackedNBits:
    """Repack MatMulNBits weights into the layout :func:`matmul_nbits_packed` reads (panel16 for 4 bits,
    two panel16 nibble halves for 8 bits, the numpy k-major words for 2 bits).

    >>> packed = prepack_matmul_nbits(B, scales, None, K=1024, N=1024, bits=4, block_size=32)
    >>> (y,) = matmul_nbits_packed(a, packed)
    """
    _check_attrs(K, N, bits, block_size)
    kb = -(-K // block_size)
    blob = block_size * bits // 8
    B = np.asarray(B)
    if B.dtype != np.uint8 or B.size != N * kb * blob:
        raise KernelError(
            f"MatMulNBits B must be uint8 [N={N}, k_blocks={kb}, blob_size={blob}], got {B.dtype} {list(B.shape)}"
        )
    if bits == 4:
        _as_blocks(scales, N, kb, "scales")
        if zero_points is not None:
            zero_points = np.asarray(zero_points)
            _as_blocks(zero_points, N, -(-kb // 2) if zero_points.dtype == np.uint8 else kb, "zero_points")
        return q4.pack_q4(B, scales, zero_points, K=K, N=N, block_size=block_size)
    if bits == 8:
        _as_blocks(scales, N, kb, "scales")
        if zero_points is not None:
            zero_points = _as_blocks(np.asarray(zero_points), N, kb, "zero_points")
        return pack_q8_split(B, scales, zero_points, K=K, N=N, block_size=block_size)
    # Little-endian bytes b0..b3 of a block read as one uint32 are exactly the word layout (values low bits
    # first), so repacking is one transpose [N, kb, words] -> [kb, words, N].
    q = np.ascontiguousarray(B).reshape(N, kb, blob).view("<u4")
    packed = np.ascontiguousarray(q.transpose(1, 2, 0)).astype(np.uint32, copy=False)
    s = _as_blocks(scales, N, kb, "scales").astype(np.float32, copy=False)
    if zero_points is None:
        zp = np.float32(1 << (bits - 1))
    elif zero_points.dtype == np.uint8:
        row = -(-kb * bits // 8)
        zp = unpack_bits(_as_blocks(zero_points, N, row, "zero_points"), bits, kb).astype(np.float32)
    else:
        zp = _as_blocks(zero_points, N, kb, "zero_points").astype(np.float32)
    offsets = -(zp * s)
    return PackedNBits(
        layout_key(bits, block_size), K, N, bits, block_size, packed,
        np.ascontiguousarray(s.T), np.ascontiguousarray(offsets.T.astype(np.float32)),
    )


_SCRATCH = threading.local()
#: packed bytes of one column chunk of :func:`matmul_nbits_source` (the per-thread scratch stays this small)
SOURCE_CHUNK_BYTES = 4 << 20


def thread_scratch(nbytes: int) -> np.ndarray:
    """``nbytes`` of this thread's pack scratch (uint8, 64-byte aligned as packed weights are), grown to
    the largest request and reused: a pack into it faults no fresh memory after the first (first touch
    costs ~1-2 ms/MB on the cold path)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < nbytes:
        buf = _SCRATCH.buf = aligned_empty(nbytes)
    return buf[:nbytes]


def _as_blocks(x: np.ndarray, n: int, cols: int, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.size != n * cols:
        raise KernelError(f"MatMulNBits {name} must hold N*{cols} = {n * cols} values, got shape {list(x.shape)}")
    return x.reshape(n, cols)


def _check_attrs(K: int, N: int, bits: int, block_size: int) -> None:
    if bits not in _SUPPORTED_BITS:
        raise KernelError(f"MatMulNBits bits={bits} is not supported (supported: {_SUPPORTED_BITS})")
    if block_size < 16 or block_size & (block_size - 1):
        raise KernelError(f"MatMulNBits block_size={block_size} must be a power of two >= 16")
    if K <= 0 or N <= 0:
        raise KernelError(f"MatMulNBits K={K} and N={N} must be positive")


# **** compute ****


def matmul_nbits_packed(
    A: np.ndarray, packed: PackedQ4 | PackedQ8Split | PackedNBits, bias: np.ndarray | None = None, *,
    accuracy_level: int = 0
) -> tuple[np.ndarray]:
    """MatMulNBits on prepacked weights: ``A [..., K] -> Y [..., N]`` in A's float dtype.

    4-bit weights with float32 C-contiguous A and no bias (a decode step's calls) take a short path: one
    native call on A as it is, ~1 us of Python less than the general one at M=1 (benchmarks/kernels_nbits)."""
    if A.shape[-1] != packed.K:
        raise KernelError(f"MatMulNBits A has {A.shape[-1]} columns, expected K={packed.K}")
    if packed.__class__ is PackedQ4 and A.dtype is _F32 and bias is None and A.flags.c_contiguous:
        int8 = INT8_ORDERS[int8_order()] if accuracy_level == 4 and packed.zp_kind != q4.ZP_F32 else 0
        return (native.matmul_q4(A, packed, None, int8),)
    out_dtype = A.dtype if A.dtype in (np.float16, np.float32) else np.float32
    a2 = np.ascontiguousarray(A.reshape(-1, packed.K), dtype=np.float32)
    b32 = None if bias is None else np.ascontiguousarray(bias.reshape(-1), dtype=np.float32)
    if b32 is not None and b32.size != packed.N:
        raise KernelError(f"MatMulNBits bias has {b32.size} values, expected N={packed.N}")
    if isinstance(packed, PackedQ4):
        int8 = INT8_ORDERS[int8_order()] if accuracy_level == 4 and packed.zp_kind != q4.ZP_F32 else 0
        y = native.matmul_q4(a2, packed, b32, int8)
    elif isinstance(packed, PackedQ8Split):
        int8 = INT8_ORDERS[int8_order()] if accuracy_level == 4 and packed.int8_capable else 0
        y = native.matmul_q4(a2, packed.hi, b32, int8)
        y += native.matmul_q4(a2, packed.lo, None, int8)
    else:
        y = _matmul_2d(a2, packed)
        if b32 is not None:
            y += b32
    return (y.reshape(A.shape[:-1] + (packed.N,)).astype(out_dtype, copy=False),)


def _matmul_2d(a: np.ndarray, p: PackedNBits) -> np.ndarray:
    bs = p.block_size
    blocks_per_panel = max(1, PANEL_BYTES // (4 * bs * p.N))
    y = None
    panel = np.empty((min(blocks_per_panel, p.k_blocks) * bs, p.N), np.float32)
    for b0 in range(0, p.k_blocks, blocks_per_panel):
        b1 = min(p.k_blocks, b0 + blocks_per_panel)
        rows = min(p.K, b1 * bs) - b0 * bs
        w = panel[: (b1 - b0) * bs]
        _dequantize_numpy(p, b0, b1, w)
        part = a[:, b0 * bs: b0 * bs + rows] @ w[:rows]
        if y is None:
            y = part
        else:
            y += part
    return y


def _dequantize_numpy(p: PackedNBits, b0: int, b1: int, out: np.ndarray) -> None:
    per = 32 // p.bits
    mask = np.uint32((1 << p.bits) - 1)
    words = p.words[b0:b1]
    view = out.reshape(b1 - b0, words.shape[1], per, p.N)
    s = p.scales[b0:b1, None, :]
    o = p.offsets[b0:b1, None, :]
    for i in range(per):
        v = view[:, :, i, :]
        np.copyto(v, (words >> np.uint32(p.bits * i)) & mask, casting="unsafe")
        v *= s
        v += o


def dequantize_matmul_nbits(packed: PackedQ4 | PackedQ8Split | PackedNBits) -> np.ndarray:
    """The fp32 weight matrix ``W [K, N]`` (for tests and debugging)."""
    if isinstance(packed, PackedQ4):
        return q4.dequantize_q4(packed)
    if isinstance(packed, PackedQ8Split):
        return q4.dequantize_q4(packed.hi) + q4.dequantize_q4(packed.lo)
    out = np.empty((packed.k_blocks * packed.block_size, packed.N), np.float32)
    _dequantize_numpy(packed, 0, packed.k_blocks, out)
    return out[: packed.K]


@kernel("MatMulNBits", since=1, domain="com.microsoft")
def matmul_nbits(
    A: np.ndarray,
    B: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    bits: int = 4,
    block_size: int,
    accuracy_level: int = 0,
    weight_prepacked: int = 0,
) -> tuple[np.ndarray]:
    """Unprepacked entry point: prepacks B for this call only (4 bits: into this thread's reused scratch),
    then runs :func:`matmul_nbits_packed`."""
    if weight_prepacked:
        raise KernelError(f"MatMulNBits weight_prepacked={weight_prepacked} (a CUDA layout) is not supported on CPU")
    if g_idx is not None and g_idx.size and not np.array_equal(g_idx.reshape(-1), np.arange(K) // block_size):
        raise KernelError("MatMulNBits with a non-trivial g_idx (act-order) is not supported")
    if B.size == 0:  # an omitted projection: zeros (or the bias)
        out_dtype = A.dtype if A.dtype in (np.float16, np.float32) else np.float32
        y = np.zeros(A.shape[:-1] + (N,), np.float32)
        if bias is not None:
            y += bias.astype(np.float32)
        return (y.astype(out_dtype),)
    if bits == 4:
        return matmul_nbits_source(A, B, scales, zero_points, bias, K=K, N=N, block_size=block_size,
                                   accuracy_level=accuracy_level)
    packed = prepack_matmul_nbits(B, scales, zero_points, K=K, N=N, bits=bits, block_size=block_size)
    return matmul_nbits_packed(A, packed, bias, accuracy_level=accuracy_level)


def matmul_nbits_source(A: np.ndarray, B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                        bias: np.ndarray | None = None, *, K: int, N: int, block_size: int,
                        accuracy_level: int = 0) -> tuple[np.ndarray]:
    """4-bit MatMulNBits from the source arrays, with the bits of ``matmul_nbits_packed(A, prepack(...))``.

    With the extension, :func:`native.matmul_q4_source`: the pool's tasks pack a few panels each into their
    thread's scratch and multiply them, so packing runs on every intra-op thread, beside the multiply
    (it ran on the calling thread alone before, up to half of a cold first run's MatMulNBits time).
    Without it, N in column chunks of at most :data:`SOURCE_CHUNK_BYTES` packed, each packed into this
    thread's reused scratch (faulted in once, not per call) and multiplied. An output column's sums do not
    depend on the other columns: same bits either way (tests/runtime/test_source_forms.py,
    tests/kernels/test_matmul_nbits_source.py)."""
    _check_attrs(K, N, 4, block_size)
    kb = -(-K // block_size)
    B = np.asarray(B)
    if B.dtype != np.uint8 or B.size != N * kb * block_size // 2:
        raise KernelError(f"MatMulNBits B must be uint8 [N={N}, k_blocks={kb}, blob_size={block_size // 2}], "
                          f"got {B.dtype} {list(B.shape)}")
    scales = _as_blocks(scales, N, kb, "scales")
    if zero_points is not None:
        zero_points = np.asarray(zero_points)
        zero_points = _as_blocks(zero_points, N, -(-kb // 2) if zero_points.dtype == np.uint8 else kb, "zero_points")
    zk = q4.ZP_NONE if zero_points is None else (q4.ZP_U4 if zero_points.dtype == np.uint8 else q4.ZP_F32)
    b = None if bias is None else np.asarray(bias).reshape(-1)
    if b is not None and b.size != N:
        raise KernelError(f"MatMulNBits bias has {b.size} values, expected N={N}")
    y = _source_native(A, B, scales, zero_points, b, K=K, N=N, block_size=block_size, zk=zk,
                       accuracy_level=accuracy_level) if native.available() else None
    if y is not None:
        return y
    cols = max(16, SOURCE_CHUNK_BYTES // sum(q4.section_sizes(K, 16, block_size, zk)) * 16)
    B2 = B.reshape(N, -1)
    y = None
    for n0 in range(0, N, cols):
        n = min(N, n0 + cols) - n0
        zp = None if zero_points is None else zero_points[n0:n0 + n]
        out = thread_scratch(sum(q4.section_sizes(K, n, block_size, zk)))
        packed = q4.pack_q4(B2[n0:n0 + n], scales[n0:n0 + n], zp, K=K, N=n, block_size=block_size, out=out)
        (part,) = matmul_nbits_packed(A, packed, None if b is None else b[n0:n0 + n], accuracy_level=accuracy_level)
        if n == N:  # one chunk: its output is the output
            return (part,)
        if y is None:
            y = np.empty(part.shape[:-1] + (N,), part.dtype)
        y[..., n0:n0 + n] = part
    return (y,)


def _source_native(A: np.ndarray, B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                   bias: np.ndarray | None, *, K: int, N: int, block_size: int, zk: int,
                   accuracy_level: int) -> tuple[np.ndarray] | None:
    """:func:`matmul_nbits_source` on the extension: :func:`matmul_nbits_packed`'s conversions, then
    :func:`native.matmul_q4_source` on the source arrays (validated by the caller); None when the
    extension lacks it (an older build)."""
    if A.shape[-1] != K:
        raise KernelError(f"MatMulNBits A has {A.shape[-1]} columns, expected K={K}")
    out_dtype = A.dtype if A.dtype in (np.float16, np.float32) else np.float32
    a2 = np.ascontiguousarray(A.reshape(-1, K), dtype=np.float32)
    b32 = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    int8 = INT8_ORDERS[int8_order()] if accuracy_level == 4 and zk != q4.ZP_F32 else 0
    zp = None
    if zero_points is not None:
        zp = np.ascontiguousarray(zero_points, dtype=np.uint8 if zk == q4.ZP_U4 else np.float32)
    y = native.matmul_q4_source(a2, np.ascontiguousarray(B), np.ascontiguousarray(scales, dtype=np.float32), zp, b32,
                                int8, K=K, N=N, block_size=block_size, zp_kind=zk)
    if y is None:
        return None
    return (y.reshape(A.shape[:-1] + (N,)).astype(out_dtype, copy=False),)


# **** prepack rule (prepared execution) ****

_NODE_INPUTS = ("A", "B", "scales", "zero_points", "g_idx", "bias")


@prepack_rule("MatMulNBits", domain="com.microsoft")
def matmul_nbits_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    """Pack B, scales and (when present) zero points once per session when they are initializers."""
    has_zp = len(node.input) > 3 and bool(node.input[3])
    sources = (1, 2, 3) if has_zp else (1, 2)
    if not set(sources) <= const_inputs or 0 in const_inputs or attrs.get("weight_prepacked", 0):
        return None
    try:
        K, N, bits, bs = int(attrs["K"]), int(attrs["N"]), int(attrs.get("bits", 4)), int(attrs["block_size"])
        _check_attrs(K, N, bits, bs)
    except (KeyError, KernelError):
        return None  # the plain kernel reports the problem when the node runs
    if const_shapes[1][1] != "uint8" or int(np.prod(const_shapes[1][0])) == 0:
        return None
    # positions of the inputs the packed kernel still receives after A, in node order
    rest = tuple(i for i in range(1, len(node.input)) if i not in sources)
    level = int(attrs.get("accuracy_level", 0))

    def pack(B, scales, zero_points=None):
        return prepack_matmul_nbits(B, scales, zero_points, K=K, N=N, bits=bits, block_size=bs)

    def run(packed: PackedQ4 | PackedQ8Split | PackedNBits | SourceForm, A: np.ndarray, *others) -> tuple[np.ndarray]:
        extra = dict(zip((_NODE_INPUTS[i] for i in rest), others))
        g_idx = extra.get("g_idx")
        if g_idx is not None and g_idx.size and not np.array_equal(g_idx.reshape(-1), np.arange(K) // bs):
            raise KernelError("MatMulNBits with a non-trivial g_idx (act-order) is not supported")
        if packed.__class__ is SourceForm:  # not prepacked yet (a cold run): 4 bits, from the sources
            src = packed.arrays
            return matmul_nbits_source(A, src[0], src[1], src[2] if has_zp else None, extra.get("bias"), K=K, N=N,
                                       block_size=bs, accuracy_level=level)
        return matmul_nbits_packed(A, packed, extra.get("bias"), accuracy_level=level)

    kb = -(-K // bs)
    if bits == 4:
        zk = q4.ZP_NONE if not has_zp else (q4.ZP_U4 if const_shapes[3][1] == "uint8" else q4.ZP_F32)
        return PrepackSpec(sources, q4.layout_key(bs, zk, K, N), pack, run, PackedQ4.to_bytes,
                           functools.partial(PackedQ4.from_bytes, K=K, N=N, block_size=bs, zp_kind=zk),
                           sum(q4.section_sizes(K, N, bs, zk)), source_form=True)
    if bits == 8:
        zn = "sym" if not has_zp else ("zpu8" if const_shapes[3][1] == "uint8" else "zpf32")
        return PrepackSpec(sources, q8.layout_key(bs, zn, K, N), pack, run, PackedQ8Split.to_bytes,
                           functools.partial(PackedQ8Split.from_bytes, K=K, N=N, block_size=bs, zp_kind=zn),
                           q8.packed_size(K, N, bs, zn))
    packed_bytes = kb * (bs * bits // 32) * N * 4 + 2 * kb * N * 4  # words + float32 scales and offsets
    return PrepackSpec(
        sources, f"{layout_key(bits, bs)}-k{K}-n{N}", pack, run,
        lambda p: np.frombuffer(p.to_bytes(), np.uint8), PackedNBits.from_bytes, packed_bytes,
    )
