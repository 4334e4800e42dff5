"""Pooling: MaxPool (with Indices), AveragePool, LpPool and the Global* pools, every spatial rank.

Windowed pools reduce a strided window view ``[N, C, *out, *k]`` of the padded input (see
:mod:`_spatial`); max pads with the dtype's lowest value, average and Lp with zeros. AveragePool's
divisor is the number of window elements inside the input (count_include_pad=0) or inside the
explicitly padded input (count_include_pad=1); ceil-mode overhang never counts, as in onnxruntime.
Float32 2-D Max/AveragePool (MaxPool without Indices) run in the extension instead (``winpool.c``: the
same geometry and divisors, separable passes over a padded copy of each plane).
"""

from __future__ import annotations

import itertools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import native
from onnx_prepared.kernels.registry import kernel, specializes


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _setup(op: str, x: np.ndarray, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode):
    nd = x.ndim - 2
    if nd < 1:
        raise KernelError(f"{op}: input must have a batch, a channel and at least one spatial axis, got "
                          f"shape {list(x.shape)}")
    kshape = sp.ints(kernel_shape, nd, 0, "kernel_shape", op)
    if any(k < 1 for k in kshape):
        raise KernelError(f"{op}: kernel_shape={list(kernel_shape or [])} is required and must be positive")
    begins, ends, out = sp.geometry(op, x.shape[2:], kshape, auto_pad=auto_pad, pads=pads, strides=strides,
                                    dilations=dilations, ceil_mode=ceil_mode, same_undilated=True)
    return kshape, begins, ends, out, sp.ints(strides, nd, 1, "strides", op), sp.ints(dilations, nd, 1,
                                                                                         "dilations", op)


def _native_2d(x: np.ndarray, out) -> bool:
    """Whether ``winpool.c`` takes the pool: float32, two spatial axes, a non-empty output."""
    return x.dtype == np.float32 and x.ndim == 4 and x.size > 0 and all(o > 0 for o in out)


def _tap_reduce(win: np.ndarray, nd: int, ufunc) -> np.ndarray:
    """``ufunc``-reduce the window view over its kernel axes, one tap at a time.

    NOTE: numpy's reduction over the strided kernel axes of a 6-D view is ~100x slower than a loop of
    elementwise ufuncs over the taps (measured 86 ms vs 0.7 ms for a 3x3 max over 64x112x112).
    """
    kshape = win.shape[2 + nd:]
    taps = itertools.product(*(range(k) for k in kshape))
    y = np.array(win[(Ellipsis,) + next(taps)])
    for tap in taps:
        ufunc(y, win[(Ellipsis,) + tap], out=y)
    return y


@kernel("MaxPool", since=1)
def max_pool(
    X: np.ndarray, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None, pads: list[int] | None = None, storage_order: int = 0,
    strides: list[int] | None = None, n_outputs: int = 1,
) -> tuple:
    kshape, begins, ends, out, strides, dilations = _setup("MaxPool", X, kernel_shape, auto_pad, pads, strides,
                                                           dilations, ceil_mode)
    nd = len(kshape)
    if n_outputs < 2 and _native_2d(X, out):
        y = native.pool2d(X, out, kshape, begins, ends, strides, dilations, avg=False)
        if y is not None:
            return (y,)
    xp = sp.pad_input(X, begins, ends, out, kshape, strides, dilations, _lowest(X.dtype))
    win = sp.windows(xp, out, kshape, strides, dilations)
    if n_outputs < 2:
        return (_tap_reduce(win, nd, np.maximum) if win.size else np.empty(win.shape[:2 + nd], X.dtype),)
    flat = win.reshape(win.shape[:2 + nd] + (-1,))
    arg = np.argmax(flat, axis=-1)
    y = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    # window offset -> input coordinates -> flat index into X (row- or column-major spatial order)
    taps = np.unravel_index(arg, kshape)
    n, c = X.shape[:2]
    spatial = X.shape[2:]
    idx = np.zeros(arg.shape, dtype=np.int64)
    coords = []
    for i in range(nd):
        pos = np.arange(out[i], dtype=np.int64).reshape((-1,) + (1,) * (nd - 1 - i)) * strides[i] - begins[i]
        coords.append(pos + taps[i].astype(np.int64) * dilations[i])
    order = range(nd) if not storage_order else range(nd - 1, -1, -1)
    for i in order:
        idx = idx * spatial[i] + coords[i]
    plane = sp.prod(spatial)
    base = (np.arange(n * c, dtype=np.int64) * plane).reshape((n, c) + (1,) * nd)
    return y, idx + base


@kernel("AveragePool", since=1)
def average_pool(
    X: np.ndarray, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0,
    dilations: list[int] | None = None, kernel_shape: list[int] | None = None, pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    kshape, begins, ends, out, strides, dilations = _setup("AveragePool", X, kernel_shape, auto_pad, pads,
                                                           strides, dilations, ceil_mode)
    nd = len(kshape)
    if _native_2d(X, out):
        y = native.pool2d(X, out, kshape, begins, ends, strides, dilations, avg=True,
                          include_pad=bool(count_include_pad))
        if y is not None:
            return (y,)
    dtype = X.dtype
    xw = X.astype(sp.work_dtype(dtype), copy=False)
    xp = sp.pad_input(xw, begins, ends, out, kshape, strides, dilations, 0)
    y = _tap_reduce(sp.windows(xp, out, kshape, strides, dilations), nd, np.add)
    y /= _counts(X.shape[2:], begins, ends, out, kshape, strides, dilations, count_include_pad, xw.dtype)
    return (y.astype(dtype, copy=False),)


def _counts(spatial, begins, ends, out, kshape, strides, dilations, include_pad: int, dtype) -> np.ndarray:
    """Per-output divisor: window taps inside the input (or inside the explicitly padded input)."""
    nd = len(spatial)
    total = None
    for i in range(nd):
        lo, hi = (-begins[i], spatial[i] + ends[i]) if include_pad else (0, spatial[i])
        pos = np.arange(out[i])[:, None] * strides[i] - begins[i] + np.arange(kshape[i])[None, :] * dilations[i]
        cnt = ((pos >= lo) & (pos < hi)).sum(axis=1).astype(dtype).reshape((-1,) + (1,) * (nd - 1 - i))
        total = cnt if total is None else total * cnt
    return np.maximum(total, 1)


@kernel("LpPool", since=1)
def lp_pool(
    X: np.ndarray, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None, p: int = 2, pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    kshape, begins, ends, out, strides, dilations = _setup("LpPool", X, kernel_shape, auto_pad, pads, strides,
                                                           dilations, ceil_mode)
    dtype = X.dtype
    xw = np.abs(X.astype(sp.work_dtype(dtype), copy=False))
    xw = xw * xw if p == 2 else xw ** p
    xp = sp.pad_input(xw, begins, ends, out, kshape, strides, dilations, 0)
    y = _tap_reduce(sp.windows(xp, out, kshape, strides, dilations), len(kshape), np.add)
    y = np.sqrt(y) if p == 2 else y ** (1.0 / p)
    return (y.astype(dtype, copy=False),)


def _global_axes(x: np.ndarray, op: str) -> tuple[int, ...]:
    if x.ndim < 3:
        raise KernelError(f"{op}: input must have at least one spatial axis, got shape {list(x.shape)}")
    return tuple(range(2, x.ndim))


@kernel("GlobalAveragePool", since=1)
def global_average_pool(X: np.ndarray) -> tuple[np.ndarray]:
    axes = _global_axes(X, "GlobalAveragePool")
    if X.dtype.name in sp.HALF:
        return (np.mean(X, axis=axes, keepdims=True, dtype=np.float32).astype(X.dtype),)
    if X.dtype.kind != "f" or not X.flags.c_contiguous or X.size == 0:
        return (np.mean(X, axis=axes, keepdims=True),)
    if X.dtype == np.float32:
        y = native.global_avg(X)
        if y is not None:
            return (y,)
    # NOTE: one pairwise add.reduce over the flattened plane times 1/count: np.mean's wrapper cost about
    # as much as the reduction itself on SE blocks' small planes (12.9 -> 6.0 us at 16x16x16)
    n, c = X.shape[:2]
    y = np.add.reduce(X.reshape(n, c, -1), axis=2)
    y *= X.dtype.type(1.0 / (X.size // max(n * c, 1)))
    return (y.reshape((n, c) + (1,) * len(axes)),)


@kernel("GlobalMaxPool", since=1)
def global_max_pool(X: np.ndarray) -> tuple[np.ndarray]:
    return (np.max(X, axis=_global_axes(X, "GlobalMaxPool"), keepdims=True),)


@kernel("GlobalLpPool", since=2)
def global_lp_pool(X: np.ndarray, *, p: int = 2) -> tuple[np.ndarray]:
    axes = _global_axes(X, "GlobalLpPool")
    xw = np.abs(X.astype(sp.work_dtype(X.dtype), copy=False))
    y = np.sqrt(np.sum(xw * xw, axis=axes, keepdims=True)) if p == 2 else np.sum(
        xw ** p, axis=axes, keepdims=True) ** (1.0 / p)
    return (y.astype(X.dtype, copy=False),)


# **** bound calls: geometry once per input shape ****


_F32 = np.dtype(np.float32)


class _Pool2dBound:
    """A Max/AveragePool node's call that settles the geometry and ``winpool.c``'s dims once per input
    shape: each later float32 NCHW call allocates the output and calls the extension (about 20 us of
    attribute parsing per call before, on small planes more than the pool itself). Anything else, or
    no extension (the numpy fallback, checked per call), goes through the kernel as before.

    :meth:`bind` returns the hot call as a closure over the last shape's plan (a closure call and its
    checks cost ~1.5 us less than a method and a dict lookup, the pool itself ~1 us on bn_cnn's planes)."""

    __slots__ = ("_attrs", "_avg", "_kernel", "_last", "_plans")

    def __init__(self, fn, avg: bool, attrs: dict):
        self._kernel, self._avg, self._attrs, self._plans = fn, avg, attrs, {}
        self._last: list = [None, None, None, None]  # shape, extension, output shape, dims

    def bind(self):
        """The node's call: the last shape's plan checked inline, anything else through :meth:`__call__`."""
        last, slow, empty = self._last, self.__call__, np.empty

        def pool_bound(X: np.ndarray) -> tuple:
            if X.shape == last[0] and X.dtype is _F32 and last[1] is native._ext and X.flags.c_contiguous:
                y = empty(last[2], _F32)
                last[1].pool2d(X, y, last[3])
                return (y,)
            return slow(X)

        return pool_bound

    def __call__(self, X: np.ndarray) -> tuple:
        plan = self._plans.get(X.shape) if X.dtype == np.float32 else None
        if plan is None and X.dtype == np.float32:
            plan = self._plans[X.shape] = self._plan(X)
        if plan and plan[0] is native._ext and X.flags.c_contiguous:
            self._last[:] = (X.shape, *plan)
            y = np.empty(plan[1], np.float32)
            plan[0].pool2d(X, y, plan[2])
            return (y,)
        return self._kernel(X, **self._attrs)

    def _plan(self, X: np.ndarray):
        a = self._attrs
        if native._ext is None or X.ndim != 4:
            return False
        kshape, begins, ends, out, strides, dilations = _setup(
            "AveragePool" if self._avg else "MaxPool", X, a.get("kernel_shape"), a.get("auto_pad", "NOTSET"),
            a.get("pads"), a.get("strides"), a.get("dilations"), a.get("ceil_mode", 0))
        if not _native_2d(X, out):
            return False
        n, c, h, w = X.shape
        dims = np.array([n, c, h, w, *kshape, *out, begins[0], begins[1], ends[0], ends[1], *strides, *dilations,
                         int(self._avg), int(bool(a.get("count_include_pad", 0)))], np.int64)
        return native._ext, (n, c, *out), dims


@specializes(max_pool)
def _max_pool_bound(consts: dict, n_inputs: int, **attrs):
    return None if attrs.get("n_outputs", 1) >= 2 else _Pool2dBound(max_pool, False, attrs).bind()


@specializes(average_pool)
def _average_pool_bound(consts: dict, n_inputs: int, **attrs):
    return _Pool2dBound(average_pool, True, attrs).bind()


def _per_plane_f32(fn: str, X: np.ndarray) -> np.ndarray | None:
    """``gap.c``'s ``fn`` (global_avg, global_max) over the [N, C] planes of a float32 C-contiguous X of
    rank >= 3, as [N, C, 1, ...]; None where it does not apply (no extension, another dtype or layout)."""
    ext = native._ext
    if ext is None or X.dtype != np.float32 or X.ndim < 3 or not X.size or not X.flags.c_contiguous:
        return None
    n, c = X.shape[:2]
    y = np.empty((n, c) + (1,) * (X.ndim - 2), np.float32)
    getattr(ext, fn)(X, y, n * c, X.size // (n * c))
    return y


def _global_average_pool_f32(X: np.ndarray) -> tuple[np.ndarray]:
    """GlobalAveragePool's float32 contiguous call straight to ``gap.c`` (the kernel's dtype checks cost
    ~10 us, four times the reduction on a small plane)."""
    y = _per_plane_f32("global_avg", X)
    return (y,) if y is not None else global_average_pool(X)


def _global_max_pool_flat(X: np.ndarray) -> tuple[np.ndarray]:
    """GlobalMaxPool of float32 contiguous planes in one ``gap.c`` call, otherwise as one
    ``maximum.reduce`` over each flattened plane (np.max over an axis tuple costs ~8 us more on small
    planes, the reduction itself ~4 us more than the native call on [1, 16, 4, 4]; the same values, NaN
    propagating)."""
    y = _per_plane_f32("global_max", X)
    if y is not None:
        return (y,)
    if X.ndim >= 3 and X.size:
        n, c = X.shape[:2]
        return (np.maximum.reduce(X.reshape(n, c, -1), axis=2).reshape((n, c) + (1,) * (X.ndim - 2)),)
    return global_max_pool(X)


def _per_plane_bound(fn: str, general):
    """The Global pool's node call: ``gap.c``'s ``fn`` with the last input shape's output shape and plane
    counts checked inline (~1.5 us less per call than :func:`_per_plane_f32`'s checks on bn_cnn's [1, 16, 4,
    4]); another shape, dtype or layout, or no extension, through ``general`` (which settles that shape)."""
    last: list = [None, None, None, 0, 0, None]  # shape, extension, output shape, planes, L, the function
    empty = np.empty

    def per_plane_bound(X: np.ndarray) -> tuple:
        if X.shape == last[0] and X.dtype is _F32 and last[1] is native._ext and X.flags.c_contiguous:
            y = empty(last[2], _F32)
            last[5](X, y, last[3], last[4])
            return (y,)
        ext = native._ext
        if ext is not None and X.dtype is _F32 and X.ndim >= 3 and X.size and X.flags.c_contiguous:
            n, c = X.shape[:2]
            last[:] = (X.shape, ext, (n, c) + (1,) * (X.ndim - 2), n * c, X.size // (n * c), getattr(ext, fn))
        return general(X)

    return per_plane_bound


@specializes(global_average_pool)
def _global_average_pool_bound(consts: dict, n_inputs: int):
    return _per_plane_bound("global_avg", _global_average_pool_f32)


@specializes(global_max_pool)
def _global_max_pool_bound(consts: dict, n_inputs: int):
    return _per_plane_bound("global_max", _global_max_pool_flat)
