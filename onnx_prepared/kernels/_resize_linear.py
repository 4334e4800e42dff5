"""Bilinear Resize of the last two axes (float32, every other axis kept), planned once per input shape.

onnxruntime resizes such an input with its ``UpsampleBilinear``: per output row ``y`` and column ``x``
two input rows ``y1, y2`` and columns ``x1, x2`` with weights ``dy1 = |in_y - y1|``, ``dy2 = |in_y - y2|``
(both 0.5 where ``y1 == y2``) and one float sum in a fixed order,
``((dx2*dy2)*X11 + (dx1*dy2)*X21) + (dx2*dy1)*X12 + (dx1*dy1)*X22``. :class:`Linear2D` builds those
tables once and computes that sum, in the extension (``resize_linear2d``: the rows gathered once per
input row, then a vectorized loop without fused multiply-adds, the same bits at every dispatch level)
or in numpy (the same products and additions in the same order, so the same bits again); both give
onnxruntime's bits where the coordinates agree. The separable per-axis path of ``resize.py`` took
~115-170 us on lraspp's two upsamplings (four gathers and multiplies per axis); this is one call.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.kernels import native

_F = np.float32


def linear_taps(x: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's (i1, i2, d1, d2) of one axis from its original coordinates ``x`` (float32): the
    coordinate clamped into the input, ``i1`` its floor, ``i2 = min(i1 + 1, n_in - 1)``, ``d1``/``d2``
    the distances to them (the weights of ``i2``/``i1``), 0.5 each where the two taps coincide."""
    c = np.clip(x.astype(_F), _F(0), _F(n_in - 1))
    i1 = np.minimum(c.astype(np.int64), n_in - 1)
    i2 = np.minimum(i1 + 1, n_in - 1)
    d1 = np.abs(c - i1.astype(_F))
    d2 = np.abs(c - i2.astype(_F))
    same = i1 == i2
    d1[same] = 0.5
    d2[same] = 0.5
    return i1, i2, d1, d2


class Linear2D:
    """The bilinear resizing of one input shape: ``plan(X)`` for a float32 ``X`` of that shape.

    ``xh``/``xw`` are the original coordinates of the output rows/columns (``resize._coords``, or the
    output indices for a kept axis); ``extrapolation`` (tf_crop_and_resize) is the value written where
    either coordinate falls outside the input, None otherwise."""

    __slots__ = ("_ext", "_ftab", "_itab", "_np", "out_shape")

    def __init__(self, shape: tuple[int, ...], out_shape: tuple[int, ...], xh: np.ndarray, xw: np.ndarray,
                 extrapolation: float | None):
        h, w = shape[-2:]
        oh, ow = out_shape[-2:]
        planes = int(np.prod(shape[:-2], dtype=np.int64))
        y1, y2, dy1, dy2 = linear_taps(xh, h)
        x1, x2, dx1, dx2 = linear_taps(xw, w)
        extrap = extrapolation is not None
        yout = ((xh < 0) | (xh > h - 1)) if extrap else np.zeros(oh, bool)
        xout = ((xw < 0) | (xw > w - 1)) if extrap else np.zeros(ow, bool)
        ev = _F(extrapolation if extrap else 0)
        self.out_shape = tuple(int(d) for d in out_shape)
        self._itab = np.concatenate([np.array([planes, h, w, oh, ow, int(extrap)], np.int64), y1, y2, x1, x2,
                                     yout.astype(np.int64), xout.astype(np.int64)])
        self._ftab = np.concatenate([dy1, dy2, dx1, dx2, np.array([ev], _F)]).astype(_F)
        ext = native._ext
        self._ext = ext if ext is not None and hasattr(ext, "resize_linear2d") else None
        # numpy: the four weight products per output, as the extension forms them
        pairs = ((dy2, dx2), (dy2, dx1), (dy1, dx2), (dy1, dx1))
        wts = tuple(np.multiply(dx[None, :], dy[:, None]) for dy, dx in pairs)
        mask = (yout[:, None] | xout[None, :]) if extrap else None
        self._np = (y1, y2, x1, x2, wts, mask, ev)
        for a in (self._itab, self._ftab, *wts):
            a.flags.writeable = False

    def __call__(self, X: np.ndarray) -> np.ndarray:
        ext = self._ext
        if ext is not None and ext is native._ext and X.flags.c_contiguous:
            y = np.empty(self.out_shape, _F)
            ext.resize_linear2d(X, y, self._itab, self._ftab)
            return y
        return self.numpy(X)

    def numpy(self, X: np.ndarray) -> np.ndarray:
        """The same sum in numpy (no extension, or a strided ``X``): the same bits."""
        y1, y2, x1, x2, (w11, w21, w12, w22), mask, ev = self._np
        r1 = np.take(X, y1, axis=-2)
        r2 = np.take(X, y2, axis=-2)
        out = np.take(r1, x1, axis=-1)
        out *= w11
        for rows, cols, wt in ((r1, x2, w21), (r2, x1, w12), (r2, x2, w22)):
            term = np.take(rows, cols, axis=-1)
            term *= wt
            out += term
        if mask is not None:
            out[..., mask] = ev
        return out
