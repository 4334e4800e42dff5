"""Numba kernels for MatMulNBits over the k-major packed layout (optional ``fast`` extra).

Imported only by :mod:`onnx_prepared.kernels.matmul_nbits`'s background warm-up thread, never on the
first inference's critical path: importing numba costs ~0.4 s and compiling these kernels ~2 s (a few
hundred ms when numba's on-disk cache hits, ``cache=True``).

Layout (see ``matmul_nbits.PackedNBits``): ``words`` is uint32 ``[k_blocks, words_per_block, N]``;
word ``[b, j, n]`` holds ``32 // bits`` consecutive quantized values of column ``n`` at rows
``k = b * block_size + j * (32 // bits) + i`` for ``i = 0, 1, ...``, lowest bits first. The inner loops
run contiguously over ``n``, so LLVM vectorizes them (AVX2/AVX-512) with one broadcast of ``a[k]`` per
value. Dequantized ``w[k, n] = q * scales[b, n] + offsets[b, n]`` (``offsets = -zero_point * scale``),
hence ``y[n] = sum_b scales[b, n] * (sum_k a[k] q[k, n]) + offsets[b, n] * sum_k a[k]``.

Kernels are single-threaded and release the GIL (``nogil``): a numba thread pool (OpenMP/workqueue)
spinning next to OpenBLAS's threads was measured to slow both down by 10x or more on a 2-core machine.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_OPTS = {"cache": True, "nogil": True, "fastmath": True, "error_model": "numpy", "boundscheck": False}

#: columns per pass: the partial sums of a chunk stay in L1
_NCHUNK = 1024


@njit(**_OPTS)
def _block_sums(a, bs):
    kb = a.shape[0] // bs
    out = np.zeros(kb, np.float32)
    for b in range(kb):
        s = np.float32(0.0)
        for i in range(bs):
            s += a[b * bs + i]
        out[b] = s
    return out


@njit(**_OPTS)
def gemv_q4(a, words, scales, offsets, y, n0, n1):
    """y[n0:n1] = a @ W[:, n0:n1] for 4-bit words; ``a`` is zero-padded to k_blocks * block_size."""
    kb, g, _ = words.shape
    bs = 8 * g
    asum = _block_sums(a, bs)
    m15 = np.uint32(15)
    acc = np.empty(_NCHUNK, np.float32)
    out = np.empty(_NCHUNK, np.float32)
    for c0 in range(n0, n1, _NCHUNK):
        w = min(_NCHUNK, n1 - c0)
        out[:w] = 0
        for b in range(kb):
            acc[:w] = 0
            for j in range(g):
                base = b * bs + 8 * j
                a0 = a[base]
                a1 = a[base + 1]
                a2 = a[base + 2]
                a3 = a[base + 3]
                a4 = a[base + 4]
                a5 = a[base + 5]
                a6 = a[base + 6]
                a7 = a[base + 7]
                row = words[b, j, c0:c0 + w]
                for n in range(w):
                    v = row[n]
                    acc[n] += (
                        a0 * np.float32(v & m15)
                        + a1 * np.float32((v >> np.uint32(4)) & m15)
                        + a2 * np.float32((v >> np.uint32(8)) & m15)
                        + a3 * np.float32((v >> np.uint32(12)) & m15)
                        + a4 * np.float32((v >> np.uint32(16)) & m15)
                        + a5 * np.float32((v >> np.uint32(20)) & m15)
                        + a6 * np.float32((v >> np.uint32(24)) & m15)
                        + a7 * np.float32(v >> np.uint32(28))
                    )
            sb = scales[b, c0:c0 + w]
            ob = offsets[b, c0:c0 + w]
            ab = asum[b]
            for n in range(w):
                out[n] += sb[n] * acc[n] + ob[n] * ab
        y[c0:c0 + w] = out[:w]


@njit(**_OPTS)
def gemv_q8(a, words, scales, offsets, y, n0, n1):
    """As :func:`gemv_q4` for 8-bit words (4 values per word)."""
    kb, g, _ = words.shape
    bs = 4 * g
    asum = _block_sums(a, bs)
    m255 = np.uint32(255)
    acc = np.empty(_NCHUNK, np.float32)
    out = np.empty(_NCHUNK, np.float32)
    for c0 in range(n0, n1, _NCHUNK):
        w = min(_NCHUNK, n1 - c0)
        out[:w] = 0
        for b in range(kb):
            acc[:w] = 0
            for j in range(g):
                base = b * bs + 4 * j
                a0 = a[base]
                a1 = a[base + 1]
                a2 = a[base + 2]
                a3 = a[base + 3]
                row = words[b, j, c0:c0 + w]
                for n in range(w):
                    v = row[n]
                    acc[n] += (
                        a0 * np.float32(v & m255)
                        + a1 * np.float32((v >> np.uint32(8)) & m255)
                        + a2 * np.float32((v >> np.uint32(16)) & m255)
                        + a3 * np.float32(v >> np.uint32(24))
                    )
            sb = scales[b, c0:c0 + w]
            ob = offsets[b, c0:c0 + w]
            ab = asum[b]
            for n in range(w):
                out[n] += sb[n] * acc[n] + ob[n] * ab
        y[c0:c0 + w] = out[:w]


@njit(**_OPTS)
def dequantize(words, scales, offsets, bits, kb0, kb1, out):
    """out[(b - kb0) * bs + r, :] = dequantized row r of block b, for blocks kb0 <= b < kb1."""
    _, g, n_cols = words.shape
    per = 32 // bits
    bs = g * per
    mask = np.uint32((1 << bits) - 1)
    for b in range(kb0, kb1):
        r0 = (b - kb0) * bs
        sb = scales[b]
        ob = offsets[b]
        for j in range(g):
            row = words[b, j]
            for i in range(per):
                dst = out[r0 + j * per + i]
                sh = np.uint32(bits * i)
                for n in range(n_cols):
                    dst[n] = np.float32((row[n] >> sh) & mask) * sb[n] + ob[n]


def warm_up() -> None:
    """Compile (or load from numba's cache) every signature the dispatcher uses."""
    words = np.zeros((1, 4, 2), np.uint32)
    s = np.ones((1, 2), np.float32)
    y = np.empty(2, np.float32)
    gemv_q4(np.zeros(32, np.float32), words, s, s, y, 0, 2)
    gemv_q8(np.zeros(16, np.float32), words, s, s, y, 0, 2)
    dequantize(words, s, s, 4, 0, 1, np.empty((32, 2), np.float32))
