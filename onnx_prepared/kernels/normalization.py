"""Layer normalizations: LayerNormalization-17, RMSNormalization-23, onnxruntime's
SimplifiedLayerNormalization (RMS norm), the com.microsoft Skip* fusions and our own
``onnx_prepared::AddLayerNormalization`` (resolve/fusions.py's Add + LayerNormalization).

All compute in float32 (stash_type=1, the only value onnxruntime's CPU kernels implement) and cast the
result back to the input dtype. The RMS norms of an LLM (float32, last axis, a [n] scale, skip of the
input's shape) take one native pass per row (``_native/llm_norm.c``), with the same float32 operations.
float32 LayerNormalization over trailing axes takes one native call (``_native/encoder_norm.c``) in
onnxruntime's CPU order (one pass of float sums of x and x * x, ``(x - mean) / ms * scale + bias``);
the numpy fallback is the two-pass form, which differs from it by rounding only.
Statistics outputs have the input's leading dimensions and size 1 on the normalized axes, as onnxruntime
returns them.
"""

from __future__ import annotations

import math

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels.registry import kernel

_F32 = np.dtype(np.float32)


def _axes(x: np.ndarray, axis: int, op: str) -> tuple[int, ...]:
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a < x.ndim:
        raise KernelError(f"{op}: axis={axis} out of range for rank {x.ndim}")
    return tuple(range(a, x.ndim))


def _stash(stash_type: int, op: str) -> None:
    if stash_type != 1:
        raise KernelError(f"{op}: stash_type={stash_type} is not supported (only 1, float32)")


def _native_rms(x: np.ndarray, scale: np.ndarray, epsilon: float, skip: np.ndarray | None = None,
                bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(y, inv_std_var [..., 1], sum or None) through the extension, or None when the call does not fit it
    (no extension, another dtype, a scale that is not [n], a skip of another shape)."""
    n = x.shape[-1] if x.ndim else 0
    if (native._ext is None or not n or x.dtype != np.float32 or scale.dtype != np.float32 or scale.shape != (n,)
            or (skip is not None and (skip.dtype != np.float32 or skip.shape != x.shape))
            or (bias is not None and (bias.dtype != np.float32 or bias.shape != (n,)))):
        return None
    c = np.ascontiguousarray
    y = np.empty(x.shape, np.float32)
    inv = np.empty(x.shape[:-1] + (1,), np.float32)
    h = None if skip is None else np.empty(x.shape, np.float32)
    native._ext.rms_norm(c(x), None if skip is None else c(skip), None if bias is None else c(bias), c(scale), y, h,
                         inv, x.size // n, n, float(epsilon))
    return y, inv, h


def _rms(x: np.ndarray, scale: np.ndarray, axes: tuple[int, ...], epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    if axes == (x.ndim - 1,):
        got = _native_rms(x, scale, epsilon)
        if got is not None:
            return got[0], got[1]
    xf = x.astype(np.float32, copy=False)
    if axes == (xf.ndim - 1,) and xf.ndim:  # the LLM case: one fused dot per row, no squared temporary
        ms = np.vecdot(xf, xf)[..., None]
        ms /= np.float32(xf.shape[-1])
    else:
        ms = np.mean(np.square(xf), axis=axes, keepdims=True)
    ms += np.float32(epsilon)
    inv = 1.0 / np.sqrt(ms)
    y = xf * inv
    y *= scale.astype(np.float32, copy=False)
    return y, inv.astype(np.float32, copy=False)


def _layer(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axes: tuple[int, ...], epsilon: float):
    xf = x.astype(np.float32, copy=False)
    mean = np.mean(xf, axis=axes, keepdims=True)
    centered = xf - mean
    inv = 1.0 / np.sqrt(np.mean(np.square(centered), axis=axes, keepdims=True) + np.float32(epsilon))
    y = centered * inv
    y *= scale.astype(np.float32, copy=False)
    if bias is not None:
        y += bias.astype(np.float32, copy=False)
    return y, mean, inv.astype(np.float32, copy=False)


def _skip_rows(shape: tuple, skip: tuple) -> int:
    """Rows of a skip of shape ``skip`` that numpy broadcasts over the leading dims of ``shape`` by whole
    rows (the embedding sum's [1, S, H] against [B, S, H]), or 0 when it does not."""
    if skip == shape:
        return -1
    if len(skip) > len(shape):  # the sum would gain dimensions
        return 0
    k = len(skip)
    while k and skip[len(skip) - k] == 1:
        k -= 1
    tail = skip[len(skip) - k:]
    if k < 1 or len(tail) > len(shape) or shape[len(shape) - k:] != tail:
        return 0
    return math.prod(tail[:-1])


def _native_layer(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, a: int, epsilon: float,
                  stats: bool, skip: np.ndarray | None = None):
    """(y, mean, inv, sum) of LayerNorm over axes ``a:`` of ``x`` (of ``x + skip``: ``sum`` is that sum,
    else None) through the extension, statistics None unless ``stats``; or None when the call does not fit
    it (no extension, not float32, a scale or bias of another size, a skip that is not ``x``'s shape or
    broadcast over its leading dimensions by whole rows)."""
    ext = native._ext
    if ext is None or x.dtype is not _F32 or scale.dtype is not _F32:  # (builtin dtypes are singletons)
        return None
    shape = x.shape
    n = scale.size
    if not n or x.size % n or ((a != len(shape) - 1 or shape[-1] != n) and math.prod(shape[a:]) != n):
        return None
    if bias is not None and (bias.dtype is not _F32 or bias.size != n):
        return None
    rows = x.size // n
    skip_rows = rows
    if skip is not None:
        if skip.dtype is not _F32 or skip.shape[-1:] != shape[-1:]:
            return None
        skip_rows = _skip_rows(shape, skip.shape)
        if skip_rows == -1:
            skip_rows = rows
        elif not skip_rows or skip.size != skip_rows * n:
            return None
    y = np.empty(shape, np.float32)
    h = None if skip is None else np.empty(shape, np.float32)
    if stats:
        st = shape[:a] + (1,) * (len(shape) - a)
        mean, inv = np.empty(st, np.float32), np.empty(st, np.float32)
    else:
        mean = inv = None
    c = np.ascontiguousarray
    ext.layer_norm_f32(c(x), None if skip is None else c(skip), c(scale), None if bias is None else c(bias), y, h,
                       mean, inv, rows, n, float(epsilon), max(skip_rows, 1))
    return y, mean, inv, h


@kernel("LayerNormalization", since=17)
def layer_normalization(
    X: np.ndarray, Scale: np.ndarray, B: np.ndarray | None = None, *, axis: int = -1, epsilon: float = 1e-5,
    stash_type: int = 1, n_outputs: int = 3,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 goes native in onnxruntime's operation order (``_native/encoder_norm.c``); Mean and
    InvStdDev are computed only when the node has those outputs."""
    _stash(stash_type, "LayerNormalization")
    axes = _axes(X, axis, "LayerNormalization")
    got = _native_layer(X, Scale, B, axes[0], epsilon, n_outputs > 1)
    if got is not None:
        return got[0], got[1], got[2]
    y, mean, inv = _layer(X, Scale, B, axes, epsilon)
    return y.astype(X.dtype, copy=False), mean, inv


@kernel("AddLayerNormalization", since=1, domain="onnx_prepared")
def add_layer_normalization(
    A: np.ndarray, B: np.ndarray, Scale: np.ndarray, Bias: np.ndarray | None = None, *, axis: int = -1,
    epsilon: float = 1e-5, stash_type: int = 1, stats: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``LayerNormalization(Add(A, B), Scale, Bias)`` (resolve/fusions.py's Add + LayerNorm fusion):
    outputs (Y, Mean, InvStdDev, the sum). Float32 operands of one shape, or one broadcast over the
    other's leading dimensions by whole rows, take one native pass (the sum, then the LayerNorm of
    :func:`layer_normalization` on it); anything else is the unfused computation. ``stats=0``: Mean
    and InvStdDev are not computed (None; the fusion sets it when the LayerNormalization had no such
    outputs)."""
    _stash(stash_type, "AddLayerNormalization")
    if A.ndim and B.ndim:
        x, skip = (A, B) if A.size >= B.size else (B, A)  # Add commutes: the larger is x
        got = _native_layer(x, Scale, Bias, _axes(x, axis, "AddLayerNormalization")[0], epsilon, bool(stats), skip)
        if got is not None:
            return got[0], got[1], got[2], got[3]
    h = np.add(A, B)
    y, mean, inv = layer_normalization(h, Scale, Bias, axis=axis, epsilon=epsilon, n_outputs=3)
    return y, mean, inv, h


@kernel("RMSNormalization", since=23)
def rms_normalization(
    X: np.ndarray, scale: np.ndarray, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> tuple[np.ndarray]:
    _stash(stash_type, "RMSNormalization")
    y, _ = _rms(X, scale, _axes(X, axis, "RMSNormalization"), epsilon)
    return (y.astype(scale.dtype, copy=False),)


def simplified_layer_normalization(
    X: np.ndarray, scale: np.ndarray, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's RMS norm: ``Y = X / sqrt(mean(X^2) + epsilon) * scale``; also returns inv_std_var."""
    _stash(stash_type, "SimplifiedLayerNormalization")
    y, inv = _rms(X, scale, _axes(X, axis, "SimplifiedLayerNormalization"), epsilon)
    return y.astype(scale.dtype, copy=False), inv


# onnxruntime-genai exports put it in the default domain although only onnxruntime defines it there.
kernel("SimplifiedLayerNormalization", since=1)(simplified_layer_normalization)
kernel("SimplifiedLayerNormalization", since=1, domain="com.microsoft")(simplified_layer_normalization)


def _skip_sum(op: str, input: np.ndarray, skip: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if input.ndim not in (2, 3):
        raise KernelError(f"{op}: input must be 2-D or 3-D, got shape {list(input.shape)}")
    try:
        h = np.add(input, skip, dtype=np.float32)
    except ValueError as e:
        raise KernelError(f"{op}: skip shape {list(skip.shape)} does not broadcast to {list(input.shape)}") from e
    if h.shape != input.shape:
        raise KernelError(f"{op}: skip shape {list(skip.shape)} does not broadcast to {list(input.shape)}")
    if bias is not None:
        h += bias.astype(np.float32, copy=False)
    return h


@kernel("SkipSimplifiedLayerNormalization", since=1, domain="com.microsoft")
def skip_simplified_layer_normalization(
    input: np.ndarray, skip: np.ndarray, gamma: np.ndarray, bias: np.ndarray | None = None, *, epsilon: float = 1e-12
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """RMS norm of ``input + skip (+ bias)``; outputs (output, mean (zeros, unused), inv_std_var, sum)."""
    if input.ndim in (2, 3):
        got = _native_rms(input, gamma, epsilon, skip, bias)
        if got is not None:
            y, inv, h = got
            return y, np.zeros_like(inv), inv, h
    h = _skip_sum("SkipSimplifiedLayerNormalization", input, skip, bias)
    y, inv = _rms(h, gamma, (h.ndim - 1,), epsilon)
    return y.astype(input.dtype, copy=False), np.zeros_like(inv), inv, h.astype(input.dtype, copy=False)


@kernel("SkipLayerNormalization", since=1, domain="com.microsoft")
def skip_layer_normalization(
    input: np.ndarray, skip: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None = None,
    bias: np.ndarray | None = None, *, epsilon: float = 1e-12,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm of ``input + skip (+ bias)``; outputs (output, mean, inv_std_var, sum).

    The sum in onnxruntime's float32 order (``input + skip``, then ``+ bias``), then the LayerNorm in the
    extension where it fits (:func:`_native_layer`, onnxruntime's one-pass form), else in numpy."""
    h = _skip_sum("SkipLayerNormalization", input, skip, bias)
    got = _native_layer(h, gamma, beta, h.ndim - 1, epsilon, True)
    if got is not None:
        y, mean, inv, _ = got
    else:
        y, mean, inv = _layer(h, gamma, beta, (h.ndim - 1,), epsilon)
    return y.astype(input.dtype, copy=False), mean, inv, h.astype(input.dtype, copy=False)
