"""The compiled extension (``_native/_ext``): loading, CPU dispatch level, threads, and the numpy fallback.

The extension is built by ``pip install`` (``setup.py``); when it is missing (no compiler, or disabled
with ``ONNX_PREPARED_NATIVE=0``) every entry point here runs the numpy code of the same layout, so
callers never ask which one they got. The dispatch level is chosen once, at import, from CPUID/XGETBV:
``portable < avx2 < avx2vnni < avx512vnni``. ``ONNX_PREPARED_ISA=<level>`` selects a lower one (an unknown level, or one
the CPU lacks, raises :class:`NativeConfigError` naming the variable). The portable level is the oracle
the SIMD levels are tested against.

Threads: the extension owns one pthread pool (``set_num_threads``; default: the CPUs this process may
run on). A call that finds the pool busy (another Python thread's call in flight) runs single-threaded
instead of waiting. Compute releases the GIL and allocates nothing; scratch buffers are per thread and
only grow.

>>> native.dispatch_level()
'avx512vnni'
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator

import numpy as np

from onnx_prepared.errors import OnnxPreparedError

#: dispatch levels, lowest first ("numpy" is reported when the extension is absent)
LEVELS = ("portable", "avx2", "avx2vnni", "avx512vnni")
ISA_ENV = "ONNX_PREPARED_ISA"
DISABLE_ENV = "ONNX_PREPARED_NATIVE"


class NativeConfigError(OnnxPreparedError, ValueError):
    """An unknown or unsupported dispatch level, or a bad thread count."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The ``flags`` of /proc/cpuinfo (empty where it cannot be read): what onnxruntime's MLAS picks its
    kernels by, for the ops whose rounding follows its per-CPU order."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _load():
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None, f"disabled by {DISABLE_ENV}=0"
    try:
        from onnx_prepared.kernels._native import _ext
    except ImportError as e:
        return None, f"not built ({e})"
    return _ext, None


_ext, unavailable_reason = _load()
_tls = threading.local()


def available() -> bool:
    """True when the compiled extension is loaded."""
    return _ext is not None


def dispatch_level() -> str:
    """The active level (one of :data:`LEVELS`), or ``"numpy"`` without the extension."""
    return _ext.isa() if _ext is not None else "numpy"


def supported_levels() -> tuple[str, ...]:
    """Levels this CPU runs, lowest first (empty without the extension)."""
    return tuple(_ext.levels()) if _ext is not None else ()


def set_dispatch_level(level: str) -> None:
    """Select a supported level (for tests and ``ONNX_PREPARED_ISA``); raises NativeConfigError otherwise."""
    if _ext is None:
        raise NativeConfigError(f"dispatch level {level!r}: the native extension is unavailable ({unavailable_reason})")
    if level not in LEVELS:
        raise NativeConfigError(f"{ISA_ENV}={level!r} is not a dispatch level (one of {', '.join(LEVELS)})")
    if level not in supported_levels():
        raise NativeConfigError(f"dispatch level {level!r} is not supported by this CPU "
                                f"(supported: {', '.join(supported_levels())})")
    _ext.set_isa(level)


@contextlib.contextmanager
def forced_level(level: str) -> Iterator[None]:
    """Run a block at ``level`` (test helper; not thread-safe against concurrent level changes)."""
    before = dispatch_level()
    set_dispatch_level(level)
    try:
        yield
    finally:
        _ext.set_isa(before)


def set_num_threads(n: int) -> None:
    """Threads per native call, the caller included (no-op without the extension)."""
    if not isinstance(n, int) or n < 1:
        raise NativeConfigError(f"native thread count must be a positive int, got {n!r}")
    if _ext is not None:
        _ext.set_num_threads(n)


def get_num_threads() -> int:
    return _ext.get_num_threads() if _ext is not None else 1


def describe() -> str:
    """One line for ``inspect``/``demo``: which kernels and which dispatch level are active."""
    if _ext is None:
        return f"native kernels: numpy fallback ({unavailable_reason})"
    return (f"native kernels: MatMulNBits 4/8-bit (fp32 + int8), Sigmoid, LSTM/GRU/RNN recurrence, Conv GEMM blocks, "
            f"prepacked Conv SGEMM, "
            f"GroupQueryAttention, RMS norms, GatherBlockQuantized rows, "
            f"dispatch {dispatch_level()} (CPU supports {supported_levels()[-1]}), {get_num_threads()} threads")


def _scratch(nbytes: int) -> np.ndarray:
    buf = getattr(_tls, "scratch", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 1 << 16), np.uint8)
        _tls.scratch = buf
    return buf


def matmul_q4(a: np.ndarray, packed, bias: np.ndarray | None, int8: bool | int) -> np.ndarray:
    """``a`` float32 C-contiguous ``[..., K]`` times panel16 weights -> new float32 ``[..., N]`` (+ bias).

    ``int8`` selects onnxruntime's accuracy_level-4 scheme (A quantized per block to int8); the packed
    weights must then not have float zero points. As an int it also names the summation order: 1 (True)
    MLAS's AVX-512 kernels, 2 its AVX2 ones, 3 its AVX-VNNI ones, 4 ours (``matmul_nbits.int8_order``).
    The extension quantizes A into its calling thread's own scratch (``_native/module.c`` call_scratch).
    """
    y = np.empty(a.shape[:-1] + (packed.N,), np.float32)
    if _ext is None:
        from onnx_prepared.kernels._q4_panels import matmul_q4_numpy

        y2 = y.reshape(-1, packed.N)
        y2[...] = matmul_q4_numpy(a.reshape(-1, packed.K), packed, bool(int8))
        if bias is not None:
            y2 += bias
        return y
    _ext.matmul_q4(a, packed.data, y, bias, None, a.size // packed.K, packed.K, packed.N, packed.block_size,
                   packed.zp_kind, int8)
    return y


def matmul_q4_source(a: np.ndarray, B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                     bias: np.ndarray | None, int8: int, *, K: int, N: int, block_size: int, zp_kind: int
                     ) -> np.ndarray | None:
    """:func:`matmul_q4` of ``a`` on the weights ``pack_q4(B, scales, zero_points)`` would make, with its bits,
    without packing them whole: the pool's tasks each pack a few panels (16 output columns each) into
    their thread's scratch, L2-sized, and multiply every row of ``a`` by them. The cold path of a node
    whose prepack is not resident: packing runs on every intra-op thread and the packed bytes never go to
    memory. Arrays C-contiguous: ``B`` uint8 ``[N, kb, bs/2]``, ``scales`` float32 ``[N, kb]``, zero points
    uint8 ``[N, ceil(kb/2)]`` or float32 ``[N, kb]``. None without the extension."""
    if _ext is None or not hasattr(_ext, "matmul_q4_source"):
        return None
    M = a.shape[0]
    y = np.empty((M, N), np.float32)
    _ext.matmul_q4_source(a, B, scales, zero_points, y, bias, None, M, K, N, block_size, zp_kind, int8)
    return y


def sigmoid_f32(x: np.ndarray) -> np.ndarray | None:
    """Sigmoid of a float32 array in one native pass, as onnxruntime's MLAS logistic computes it (see
    ``_native/act.c``); None without the extension."""
    if _ext is None:
        return None
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)  # (not for 0-d arrays: ascontiguousarray makes them 1-d)
    y = np.empty_like(x)
    return y if _ext.sigmoid(x, y) else None


def panel16_u32(words: np.ndarray, out: np.ndarray) -> bool:
    """``out[p, k, j] = words[16 p + j, k]`` (uint32 ``[16 P, kc]`` -> ``[P, kc, 16]``, both C-contiguous):
    the panel16 transpose of a prepack in 16 x 16 blocks, GIL released (numpy's strided copy of it is
    ~4x slower); False without the extension (the caller transposes with numpy)."""
    if _ext is None or not hasattr(_ext, "panel16_u32"):
        return False
    P, kc, _ = out.shape
    _ext.panel16_u32(words, out, P, kc)
    return True


def read_sum(buf: np.ndarray) -> int:
    """Sum of a buffer's uint64 words, read by the pool's threads (the benchmarks' bandwidth probe)."""
    if _ext is None:
        return int(buf.view(np.uint64).sum())
    return _ext.read_sum(buf)


#: activation codes of ``rnn_layer`` (rnn.h), lowercase ONNX names
RNN_ACTIVATIONS = ("sigmoid", "tanh", "relu", "affine", "leakyrelu", "thresholdedrelu", "scaledtanh",
                   "hardsigmoid", "elu", "softsign", "softplus")
RNN_KINDS = {"RNN": 0, "GRU": 1, "LSTM": 2}


def rnn_layer(cfg, fcfg, x, wt, xw, bias, rt, init_h, init_c, lens, p, rbh, y, h, c, scratch) -> None:
    """A whole LSTM/GRU/RNN layer in one call (``rnn_module.c``'s ``rnn_layer``; _rnn_native.py builds
    the arguments); needs the extension."""
    _ext.rnn_layer(cfg, fcfg, x, wt, xw, bias, rt, init_h, init_c, lens, p, rbh, y, h, c, scratch)


_sgemm_bound: bool | None = None  # None: not tried yet


def conv_gemm(a: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """``a [g, M, K] @ x [n, g, K, N]`` (float32, C order) split over the pool, or None when the caller
    should use numpy (no extension, no OpenBLAS sgemm found, or OpenBLAS itself multi-threaded).

    Each task runs OpenBLAS's single-threaded sgemm on a block fixed by the shape (``conv_gemm.c``), so
    the result does not depend on the thread count.
    """
    global _sgemm_bound
    if _ext is None:
        return None
    from onnx_prepared.kernels import _blas

    if _sgemm_bound is None:
        found = _blas.sgemm_address()
        if found is not None:
            _ext.conv_gemm_set_blas(*found)
        _sgemm_bound = found is not None
    if not _sgemm_bound or _blas.current_threads() != 1:
        return None
    g, m, k = a.shape
    n, _, _, cols = x.shape
    y = np.empty((n, g, m, cols), np.float32)
    _ext.conv_gemm(a, x, y, g, m, k, cols, n)
    return y


#: rows per panel of the prepacked Conv weight layout (``sgemm.h``)
SG_PANEL = 16


def pack_panels(wm: np.ndarray) -> np.ndarray:
    """``wm [g, M, K]`` float32 as ``sgemm_packed``'s layout ``[g, ceil(M/16), K, 16]`` (rows past M zero);
    the same bytes at every dispatch level and without the extension."""
    g, m, k = wm.shape
    p = -(-m // SG_PANEL)
    out = np.zeros((g, p * SG_PANEL, k), np.float32)
    out[:, :m] = wm
    return np.ascontiguousarray(out.reshape(g, p, SG_PANEL, k).transpose(0, 1, 3, 2))


def unpack_panels(packed: np.ndarray, m: int) -> np.ndarray:
    """The ``[g, M, K]`` matrix of a :func:`pack_panels` layout (a copy; the numpy path)."""
    g, p, k, _ = packed.shape
    return packed.transpose(0, 1, 3, 2).reshape(g, p * SG_PANEL, k)[:, :m]


def epilogue(y: np.ndarray, lo: float, hi: float, act: int, alpha: float = 0.0) -> np.ndarray:
    """The native epilogues in numpy, in place: clip to [lo, hi], then HardSwish when ``act`` is
    :data:`ACT_HARDSWISH`, LeakyRelu of slope ``alpha`` when it is :data:`ACT_LEAKY_RELU`."""
    if lo != -np.inf or hi != np.inf:
        np.clip(y, lo, hi, out=y)
    if act == ACT_HARDSWISH:
        h = y * y.dtype.type(1.0 / 6.0)
        h += y.dtype.type(0.5)
        np.clip(h, 0, 1, out=h)
        y *= h
    elif act == ACT_LEAKY_RELU:
        np.multiply(y, y.dtype.type(alpha), out=y, where=y < 0)
    return y


#: ``act`` codes of the native epilogues (after the clip; sgemm.h's SG_ACT_*)
ACT_NONE, ACT_HARDSWISH, ACT_LEAKY_RELU = 0, 1, 2


def sgemm_packed(packed: np.ndarray, m: int, x: np.ndarray, bias: np.ndarray | None = None,
                 lo: float = -np.inf, hi: float = np.inf, act: int = ACT_NONE, alpha: float = 0.0) -> np.ndarray:
    """``A [g, m, K] @ x [n, g, K, N]`` (+ ``bias [g*m]``, then :func:`epilogue`) with A in the
    :func:`pack_panels` layout: ``sgemm.c`` over the pool (every
    task a fixed block, so the same values for any thread count), or numpy's matmul of the unpacked
    matrix without the extension."""
    g, _, k, _ = packed.shape
    n, _, _, cols = x.shape
    if _ext is None:
        y = np.matmul(unpack_panels(packed, m), x)
        if bias is not None:
            y += bias.reshape(g, m, 1)
        return epilogue(y, lo, hi, act, alpha)
    y = np.empty((n, g, m, cols), np.float32)
    _ext.sgemm_packed(packed, np.ascontiguousarray(x), y, bias, np.array([g, m, k, cols, n], np.int64),
                      float(lo), float(hi), act, float(alpha))
    return y


def im2col2d(x: np.ndarray, group: int, kshape, out, begins, strides, dilations, merge: bool) -> np.ndarray | None:
    """The Conv GEMM's column matrices of float32 ``x [N, C, *S]`` (1-D or 2-D): ``[N, g, C/g*K, P]``, or
    with ``merge`` ``[1, g, C/g*K, N*P]`` (the images side by side); None without the extension
    (``im2col.c``, over the pool). Pads are given by their begins, the output size fixes the ends."""
    if _ext is None:
        return None
    n, c = x.shape[:2]
    if x.ndim == 3:
        hw, ks, oo, bb, ss, dd = (1, x.shape[2]), (1, kshape[0]), (1, out[0]), (0, begins[0]), (1, strides[0]), \
            (1, dilations[0])
    else:
        hw, ks, oo, bb, ss, dd = x.shape[2:], kshape, out, begins, strides, dilations
    k, p = c // group * ks[0] * ks[1], oo[0] * oo[1]
    cols = np.empty((1, group, k, n * p) if merge else (n, group, k, p), np.float32)
    dims = np.array([n, c, *hw, group, *ks, *oo, *bb, *ss, *dd, int(merge)], np.int64)
    _ext.im2col2d(np.ascontiguousarray(x), cols, dims)
    return cols


def global_avg(x: np.ndarray) -> np.ndarray | None:
    """The mean of every ``[N, C]`` plane of float32 ``x [N, C, *S]`` as ``[N, C, 1, ...]`` (``gap.c``), or
    None without the extension."""
    if _ext is None:
        return None
    n, c = x.shape[:2]
    y = np.empty((n, c) + (1,) * (x.ndim - 2), np.float32)
    _ext.global_avg(np.ascontiguousarray(x), y, n * c, x.size // (n * c))
    return y


def depthwise2d(x: np.ndarray, wm: np.ndarray, b: np.ndarray | None, out: tuple[int, int], begins, strides,
                dilations, kshape, lo: float = -np.inf, hi: float = np.inf, act: int = ACT_NONE,
                alpha: float = 0.0) -> np.ndarray | None:
    """2-D depthwise Conv of float32 NCHW ``x`` with ``wm [C, mult, KH*KW]`` (+ bias, then :func:`epilogue`),
    or None without the extension (``depthwise.c``; pads are given by their begins, the output size fixes
    the ends)."""
    if _ext is None:
        return None
    n, c, h, w = x.shape
    mult = wm.shape[1]
    y = np.empty((n, c * mult) + tuple(out), np.float32)
    dims = np.array([n, c, h, w, mult, *kshape, *out, *begins, *strides, *dilations], np.int64)
    _ext.depthwise2d(np.ascontiguousarray(x), wm, b, y, dims, float(lo), float(hi), act, float(alpha))
    return y


def pool2d(x: np.ndarray, out: tuple[int, int], kshape, begins, ends, strides, dilations, *, avg: bool,
           include_pad: bool = False) -> np.ndarray | None:
    """2-D MaxPool (``avg`` False, NaN propagates) or AveragePool of float32 NCHW ``x`` (``winpool.c``), or
    None without the extension. Pads are given by their begins and ends; the output size fixes the
    ceil-mode overhang, which never counts in the average's divisor."""
    if _ext is None:
        return None
    n, c, h, w = x.shape
    y = np.empty((n, c) + tuple(out), np.float32)
    dims = np.array([n, c, h, w, *kshape, *out, begins[0], begins[1], ends[0], ends[1], *strides, *dilations,
                     int(avg), int(include_pad)], np.int64)
    _ext.pool2d(np.ascontiguousarray(x), y, dims)
    return y


def se_block(x: np.ndarray, w1t: np.ndarray, b1: np.ndarray | None, w2t: np.ndarray, b2: np.ndarray | None,
             alpha: float, beta: float) -> np.ndarray | None:
    """A squeeze-excite block with a HardSigmoid gate on float32 ``x [N, C, ...]`` and the 1x1 weights
    transposed, ``w1t [C, Cr]``, ``w2t [Cr, C]`` (``se_block.c``), or None without the extension."""
    if _ext is None:
        return None
    n, c = x.shape[:2]
    y = np.empty_like(x)
    _ext.se_block(x, w1t, b1, w2t, b2, y, np.array([n, c, x.size // (n * c), w1t.shape[1]], np.int64),
                  float(alpha), float(beta))
    return y


def nms_greedy(coords: np.ndarray, order: np.ndarray, max_out: int, iou_threshold: float) -> np.ndarray | None:
    """Box indices NonMaxSuppression keeps for one (batch, class) (``nms.c``), or None without the extension.

    ``coords`` float32 ``[5, N]`` (y1, x1, y2, x2, area of every box), ``order`` int64 candidates in score order.
    """
    if _ext is None:
        return None
    n = order.shape[0]
    kept = np.empty(n, np.int64)
    nk = _ext.nms_greedy(coords, order, max_out, iou_threshold, kept)
    return kept[:nk]


def _apply_env() -> None:
    level = os.environ.get(ISA_ENV)
    if level and _ext is not None:
        set_dispatch_level(level)


_apply_env()
