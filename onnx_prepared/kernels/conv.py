"""Conv on numpy + BLAS: im2col over a strided window view and one GEMM per group, bias fused.

Three variants, chosen per call from shapes only:

- pointwise (1x1 kernel, stride 1, no pads): a pure GEMM on the input reshaped to [N, g, C/g, P];
- depthwise (one input channel per group): a multiply-add per kernel tap on strided views, no im2col;
- general: columns ``[N, g, C/g*K, P]`` (1-D/2-D float32: ``native.im2col2d``; otherwise the window
  view ``[N, C, *out, *k]`` copied once), then ``W[g, M/g, C/g*K] @ cols``.

The weight is used as the matrix ``[g, M/g, C/g*prod(k)]``; :mod:`conv_prepacked` stores that matrix, or
for float32 its 16-row panels (``panel_rows``), which ``native.sgemm_packed`` multiplies without
re-packing them per call (bias in its epilogue). Half-precision inputs compute in float32.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import native
from onnx_prepared.kernels.registry import kernel


def weight_matrix(w: np.ndarray, group: int) -> np.ndarray:
    """``W [M, C/g, *k]`` as the contiguous compute-dtype matrix ``[g, M/g, C/g*prod(k)]``."""
    m = w.shape[0]
    if group < 1 or m % group:
        raise KernelError(f"Conv: {m} output channels do not split into group={group}")
    wm = w.reshape(group, m // group, -1)
    return np.ascontiguousarray(wm, dtype=sp.work_dtype(w.dtype))


def conv_core(x: np.ndarray, wm: np.ndarray, b: np.ndarray | None, kshape: tuple[int, ...], *, auto_pad: str,
              dilations, group: int, pads, strides, panel_rows: int | None = None, lo: float = -np.inf,
              hi: float = np.inf, act: int = native.ACT_NONE, alpha: float = 0.0) -> np.ndarray:
    """The convolution of ``x [N, C, *S]`` with the weight matrix ``wm [g, M/g, C/g*K]``, or, with
    ``panel_rows`` (= M/g), that matrix in ``native.pack_panels``' layout ``[g, ceil(M/g/16), C/g*K, 16]``;
    then ``native.epilogue(lo, hi, act, alpha)`` (a fused activation: in the native kernels' epilogue where they
    run, in numpy otherwise)."""
    nd = x.ndim - 2
    if nd < 1 or len(kshape) != nd:
        raise KernelError(f"Conv: input of shape {list(x.shape)} does not match a {len(kshape)}-D kernel")
    n, c = x.shape[:2]
    if panel_rows is not None:
        g, mg, cgk = wm.shape[0], panel_rows, wm.shape[2]
    else:
        g, mg, cgk = wm.shape
    if g != group or c % group or (c // group) * sp.prod(kshape) != cgk:
        raise KernelError(f"Conv: input channels {c} do not match the weight ({g * mg} x {cgk // sp.prod(kshape)} "
                          f"x {list(kshape)}) with group={group}")
    begins, ends, out = sp.geometry("Conv", x.shape[2:], kshape, auto_pad=auto_pad, pads=pads, strides=strides,
                                    dilations=dilations)
    strides = sp.ints(strides, nd, 1, "strides", "Conv")
    dilations = sp.ints(dilations, nd, 1, "dilations", "Conv")
    dtype = x.dtype
    wd = wm.dtype
    xw = x if x.dtype == wd else x.astype(wd)
    p = sp.prod(out)
    m = g * mg
    cg = c // g
    if panel_rows is not None and cg == 1:  # the prepack keeps one-channel groups unpacked: not reached
        wm, panel_rows = native.unpack_panels(wm, mg), None
    if cg == 1 and nd == 2 and kshape[1] <= 64 and wd == np.float32 and native.available() and (
            b is None or (b.shape == (m,) and b.dtype == np.float32)):
        y = native.depthwise2d(xw, wm, b, out, begins, strides, dilations, kshape, lo, hi, act, alpha)
        return y if y.dtype == dtype else y.astype(dtype)
    # NOTE: a batch of small planes joins the GEMM's columns ([g, K, N*P], one pass over the weights
    # instead of N): late ResNet layers have P = 4..16 columns per image and weights of megabytes.
    pointwise = all(k == 1 for k in kshape) and all(s == 1 for s in strides) and not any(begins) and not any(ends)
    merge = n > 1 and p < 256 and cg > 1
    # the packed GEMM adds a float32 [M] bias in its epilogue
    fuse = panel_rows is not None and (b is None or (b.shape == (m,) and b.dtype == np.float32))
    gemm = functools.partial(_gemm_packed, panel_rows, b, lo, hi, act, alpha) if fuse else functools.partial(
        _gemm_packed, panel_rows, None, -np.inf, np.inf, native.ACT_NONE, 0.0) if panel_rows is not None else _gemm
    if pointwise:
        cols = xw.reshape(n, g, cg, p)
        y = gemm(wm, cols.transpose(1, 2, 0, 3).reshape(1, g, cg, n * p)) if merge else gemm(wm, cols)
    elif cg == 1:
        y = _depthwise(xw, wm, kshape, begins, ends, out, strides, dilations)
    elif nd <= 2 and xw.dtype == np.float32 and native.available():
        y = gemm(wm, native.im2col2d(xw, g, kshape, out, begins, strides, dilations, merge))
    else:
        xp = sp.pad_input(xw, begins, ends, out, kshape, strides, dilations, 0)
        win = sp.windows(xp, out, kshape, strides, dilations)  # [N, C, *out, *k]
        if merge:  # the im2col copy itself puts the batch next to the output positions
            axes = (1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))
            y = gemm(wm, win.transpose(axes).reshape(1, g, cgk, n * p))
        else:
            axes = (0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
            y = gemm(wm, win.transpose(axes).reshape(n, g, cgk, p))
    if merge:  # columns ordered (image, position); C order for the nodes after it
        y = np.ascontiguousarray(y.reshape(m, n, p).transpose(1, 0, 2))
    y = y.reshape((n, m) + tuple(out))
    if not fuse:
        if b is not None:
            if b.shape != (m,):
                raise KernelError(f"Conv: bias shape {list(b.shape)} is not [{m}]")
            y += b.astype(wd, copy=False).reshape((m,) + (1,) * nd)
        native.epilogue(y, lo, hi, act, alpha)
    return y if y.dtype == dtype else y.astype(dtype)


def _gemm(wm: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``wm [g, M/g, K] @ cols [N, g, K, P]``: on the native pool in blocks when float32 (every core,
    thread-count independent), else numpy's matmul (OpenBLAS, single-threaded in a run)."""
    if wm.dtype == np.float32 and cols.dtype == np.float32:
        y = native.conv_gemm(wm, np.ascontiguousarray(cols))
        if y is not None:
            return y
    return np.matmul(wm, cols)


def _gemm_packed(rows: int, bias: np.ndarray | None, lo: float, hi: float, act: int, alpha: float,
                 packed: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``_gemm`` on the panel layout (``native.sgemm_packed``: the weights are read once per call, bias
    and activation applied in the epilogue); float64 never gets here (the prepack packs float32 only)."""
    return native.sgemm_packed(packed, rows, cols if cols.dtype == np.float32 else cols.astype(np.float32), bias,
                               lo, hi, act, alpha)


def _depthwise(x, wm, kshape, begins, ends, out, strides, dilations) -> np.ndarray:
    """One input channel per group: y[n, c, j] = sum over taps of w[c, j, tap] * window tap (multiplier j)."""
    if len(kshape) == 2 and x.shape[1] >= 32:
        return _depthwise_nhwc(x, wm, kshape, begins, ends, out, strides, dilations)
    if len(kshape) == 2 and strides[0] == strides[1] == 1:
        return _depthwise_flat(x, wm, kshape, begins, ends, out, 1, dilations)
    n, c = x.shape[:2]
    mult = wm.shape[1]
    nd = len(kshape)
    xp = sp.pad_input(x, begins, ends, out, kshape, strides, dilations, 0)
    win = sp.windows(xp, out, kshape, strides, dilations)  # [N, C, *out, *k]
    ones = (1,) * nd
    y = np.zeros((n, c, mult) + tuple(out), dtype=x.dtype)
    tmp = np.empty_like(y)
    for t, tap in enumerate(itertools.product(*(range(k) for k in kshape))):
        view = win[(Ellipsis,) + tap][:, :, None]  # [N, C, 1, *out]
        np.multiply(view, wm[:, :, t].reshape((c, mult) + ones), out=tmp)
        y += tmp
    return y


def _depthwise_nhwc(x, wm, kshape, begins, ends, out, strides, dilations) -> np.ndarray:
    """2-D depthwise with channels last: every tap is one multiply-add whose inner loop runs over the
    channels (contiguous), not over a short output row (measured on 960 channels at 2x2, 5x5 taps:
    0.84 -> 0.07 ms; 240 at 28x28: 2.4 -> 1.6 ms). Used from 32 channels on."""
    n, c, h, w = x.shape
    mult = wm.shape[1]
    (oh, ow), (sh, sw), (dh, dw) = out, strides, dilations
    hp = max(h + begins[0], (oh - 1) * sh + (kshape[0] - 1) * dh + 1)
    wp = max(w + begins[1], (ow - 1) * sw + (kshape[1] - 1) * dw + 1)
    xp = np.zeros((n, hp, wp, c, 1), dtype=x.dtype)
    xp[:, begins[0]:begins[0] + h, begins[1]:begins[1] + w, :, 0] = x.transpose(0, 2, 3, 1)
    wt = np.ascontiguousarray(wm.transpose(2, 0, 1))  # [taps, C, mult]
    y = np.empty((n, oh, ow, c, mult), dtype=x.dtype)
    tmp = np.empty_like(y)
    for t, (i, j) in enumerate(itertools.product(range(kshape[0]), range(kshape[1]))):
        tap = xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
        np.multiply(tap, wt[t], out=y if t == 0 else tmp)
        if t:
            y += tmp
    return np.ascontiguousarray(y.reshape(n, oh, ow, c * mult).transpose(0, 3, 1, 2))


def _depthwise_flat(x, wm, kshape, begins, ends, out, s: int, dilations) -> np.ndarray:
    """2-D depthwise on the flattened padded plane: tap (i, j) of output q = oh*Wp + ow reads flat
    element ``s*q + i*dh*Wp + j*dw``, so every tap is one long 1-D strided slice per channel (numpy's
    per-row loop overhead on [oh, ow] views dominated: 0.86 -> 0.66 ms on 240x28x28). Columns ow past
    the output width are computed on the padded grid and cropped. Used for stride 1 (at stride 2 the
    wasted columns cost more than the row loop saves)."""
    n, c, h, w = x.shape
    mult = wm.shape[1]
    (oh, ow), (dh, dw) = out, dilations
    wp = w + begins[1] + ends[1]
    wp = max(wp, (ow - 1) * s + (kshape[1] - 1) * dw + 1)
    length = oh * wp
    last = (kshape[0] - 1) * dh * wp + (kshape[1] - 1) * dw + s * (length - 1)
    hp = max(h + begins[0], -(-(last + 1) // wp))
    xp = np.zeros((n, c, hp, wp), dtype=x.dtype)
    xp[:, :, begins[0]:begins[0] + h, begins[1]:begins[1] + w] = x  # hp >= h + begins[0], wp >= w + pads
    flat = xp.reshape(n, c, 1, hp * wp)
    y = np.empty((n, c, mult, length), dtype=x.dtype)
    tmp = np.empty_like(y)
    for t, (i, j) in enumerate(itertools.product(range(kshape[0]), range(kshape[1]))):
        off = i * dh * wp + j * dw
        tap = flat[..., off:off + s * (length - 1) + 1:s]
        np.multiply(tap, wm[:, :, t, None], out=y if t == 0 else tmp)
        if t:
            y += tmp
    return y.reshape(n, c, mult, oh, wp)[..., :ow]


@kernel("Conv", since=1)
def conv(
    X: np.ndarray, W: np.ndarray, B: np.ndarray | None = None, *, auto_pad: str = "NOTSET",
    dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
    pads: list[int] | None = None, strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    kshape = tuple(W.shape[2:])
    if kernel_shape and tuple(kernel_shape) != kshape:
        raise KernelError(f"Conv: kernel_shape={list(kernel_shape)} differs from the weight's {list(kshape)}")
    return (conv_core(X, weight_matrix(W, group) if W.dtype.name in sp.HALF else _wm_view(W, group), B, kshape,
                      auto_pad=auto_pad, dilations=dilations, group=group, pads=pads, strides=strides),)


def _wm_view(w: np.ndarray, group: int) -> np.ndarray:
    if group < 1 or w.shape[0] % group:
        raise KernelError(f"Conv: {w.shape[0]} output channels do not split into group={group}")
    return w.reshape(group, w.shape[0] // group, -1)
