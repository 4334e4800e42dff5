"""Vectorized block-wise INT4 quantization in MatMulNBits' storage layout.

Layout (``com.microsoft.MatMulNBits``, bits=4, no zero_points): a weight W of logical shape [N, K]
(N output features, K input features) is cut into blocks of ``block_size`` consecutive K values.
``B`` is uint8 [N, K / block_size, block_size / 2]: value k of a block sits in byte k // 2, the low
nibble for even k, the high nibble for odd k. ``scales`` is float [N, K / block_size]. A nibble q
decodes to ``(q - 8) * scale`` (8 is the default zero point when ``zero_points`` is omitted), so
quantization is symmetric; values use -7..7, mapping each block's largest magnitude to +-7.

The same bytes reshaped to [N, K / 2] are ``GatherBlockQuantized``'s uint8 layout (bits=4,
quantize_axis=1, packed along the last axis, default zero point 8), which is what lets the tied
embedding and LM head share one initializer.
"""

from __future__ import annotations

import numpy as np


def quantize_int4(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantize float [N, K] to (packed uint8 [N, K/bs, bs/2], float32 scales [N, K/bs])."""
    n, k = w.shape
    if k % block_size or block_size % 2:
        raise ValueError(f"K={k} must be a multiple of block_size={block_size} (an even number)")
    blocks = np.asarray(w, dtype=np.float32).reshape(n, k // block_size, block_size)
    scales = np.abs(blocks).max(axis=2) / np.float32(7.0)
    scales[scales == 0] = 1.0  # an all-zero block decodes to zeros with any scale
    q = blocks * (np.float32(1.0) / scales)[..., None]
    np.rint(q, out=q)
    np.clip(q, -7, 7, out=q)
    q += 8
    nib = q.astype(np.uint8)
    packed = nib[..., 0::2] | (nib[..., 1::2] << 4)
    return packed, scales.astype(np.float32, copy=False)


def dequantize_int4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Inverse of :func:`quantize_int4`: float32 [N, K] from packed [N, K/bs, bs/2] and scales [N, K/bs]."""
    n, nb, half = packed.shape
    q = np.empty((n, nb, 2 * half), dtype=np.float32)
    q[..., 0::2] = packed & 0x0F
    q[..., 1::2] = packed >> 4
    q -= 8
    q *= scales.reshape(n, nb, 1)
    return q.reshape(n, nb * 2 * half)
