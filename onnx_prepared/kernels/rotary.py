"""RotaryEmbedding: com.microsoft (contrib) and ONNX opset 23.

Both rotate the first ``rotary_embedding_dim`` channels of every head by per-position angles:
``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)``, where (x1, x2) are the two halves of the rotated
channels, or the even/odd channels when ``interleaved=1``. Channels past ``rotary_embedding_dim`` pass
through. :func:`apply_rotary` is shared with GroupQueryAttention.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.registry import kernel


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotate ``x [B, S, N, H]`` with ``cos``/``sin`` broadcastable to ``[B, S, 1, R/2]`` (R <= H even)."""
    half = cos.shape[-1]
    rot = 2 * half
    if rot > x.shape[-1]:
        raise KernelError(f"rotary cache width {half} exceeds half the head size {x.shape[-1]}")
    cos = cos.astype(np.float32, copy=False)
    sin = sin.astype(np.float32, copy=False)
    xf = x.astype(np.float32, copy=False)
    out = np.array(xf, dtype=np.float32, copy=True)
    lo, hi = (slice(0, rot, 2), slice(1, rot, 2)) if interleaved else (slice(0, half), slice(half, rot))
    x1, x2 = xf[..., lo], xf[..., hi]
    if _fused():
        out[..., lo] = _fma(x1, cos, -(x2 * sin))
        out[..., hi] = _fma(x1, sin, x2 * cos)
    else:
        out[..., lo] = x1 * cos - x2 * sin
        out[..., hi] = x1 * sin + x2 * cos
    return out.astype(x.dtype, copy=False)


def _fused() -> bool:
    """onnxruntime's RoPE (MLAS) fuses ``x1 c - x2 s`` as one FMA over the rounded ``x2 s`` on FMA CPUs; we
    follow whenever our dispatch level has FMA (avx2 and above)."""
    from onnx_prepared.kernels import native

    return native.dispatch_level() not in ("numpy", "portable")


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once: the float32 product is exact in float64, so only the float64
    sum rounds before float32 (a double rounding that can differ from the fused result only when the
    float64 sum lands exactly on a float32 midpoint)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def _split_heads(x: np.ndarray, num_heads: int, head_size: int, op: str) -> np.ndarray:
    b, s, hidden = x.shape
    if head_size <= 0 or hidden % head_size:
        raise KernelError(f"{op}: hidden size {hidden} is not a multiple of head size {head_size}")
    return x.reshape(b, s, hidden // head_size, head_size)


@kernel("RotaryEmbedding", since=1, domain="com.microsoft")
def rotary_embedding_ms(
    input: np.ndarray,
    position_ids: np.ndarray,
    cos_cache: np.ndarray,
    sin_cache: np.ndarray,
    *,
    interleaved: int = 0,
    is_packed_batching: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    scale: float = 1.0,
) -> tuple[np.ndarray]:
    """com.microsoft RotaryEmbedding; position_ids is ``[1]`` (start position) or ``[B, S]``.

    ``scale`` is accepted and, as in onnxruntime's CPU kernel, does not change the result.
    """
    del scale
    if is_packed_batching:
        raise KernelError("com.microsoft RotaryEmbedding with is_packed_batching=1 is not supported")
    x = input
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)
    elif x.ndim == 3:
        head = x.shape[-1] // num_heads if num_heads else 2 * cos_cache.shape[-1]
        xs = _split_heads(x, num_heads, head, "RotaryEmbedding")
    else:
        raise KernelError(f"RotaryEmbedding input must be 3-D or 4-D, got shape {list(x.shape)}")
    b, s = xs.shape[0], xs.shape[1]
    pos = np.asarray(position_ids).astype(np.int64)
    if pos.size == 1 and not (b == 1 and s == 1 and pos.ndim == 2):
        pos = pos.reshape(-1)[0] + np.arange(s, dtype=np.int64)[None, :].repeat(b, 0)
    pos = pos.reshape(b, s)
    if pos.min(initial=0) < 0 or pos.max(initial=0) >= cos_cache.shape[0]:
        raise KernelError(f"RotaryEmbedding position_ids out of range for a cache of {cos_cache.shape[0]} positions")
    half = rotary_embedding_dim // 2 if rotary_embedding_dim else cos_cache.shape[-1]
    cos = cos_cache[pos][..., None, :half]
    sin = sin_cache[pos][..., None, :half]
    y = apply_rotary(xs, cos, sin, bool(interleaved))
    y = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(x.shape)
    return (np.ascontiguousarray(y),)


@kernel("RotaryEmbedding", since=23)
def rotary_embedding_23(
    X: np.ndarray,
    cos_cache: np.ndarray,
    sin_cache: np.ndarray,
    position_ids: np.ndarray | None = None,
    *,
    interleaved: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
) -> tuple[np.ndarray]:
    """ONNX RotaryEmbedding-23: X is ``[B, N, S, H]`` or ``[B, S, N*H]`` (then ``num_heads`` is required)."""
    if X.ndim == 4:
        xs = X.transpose(0, 2, 1, 3)
    elif X.ndim == 3:
        if not num_heads:
            raise KernelError("RotaryEmbedding-23 with a 3-D input needs the num_heads attribute")
        xs = _split_heads(X, num_heads, X.shape[-1] // num_heads, "RotaryEmbedding")
    else:
        raise KernelError(f"RotaryEmbedding input must be 3-D or 4-D, got shape {list(X.shape)}")
    rot = rotary_embedding_dim or xs.shape[-1]
    if position_ids is not None:
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != rot // 2:
        raise KernelError(
            f"RotaryEmbedding cos_cache last dimension {cos.shape[-1]} != rotary_embedding_dim/2 {rot // 2}"
        )
    y = apply_rotary(xs, cos[..., None, :], sin[..., None, :], bool(interleaved))
    y = y.transpose(0, 2, 1, 3) if X.ndim == 4 else y.reshape(X.shape)
    return (np.ascontiguousarray(y),)
