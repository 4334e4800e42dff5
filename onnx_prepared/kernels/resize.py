"""Resize (opsets 10-19+) and Upsample: separable interpolation, one axis at a time.

For each resized axis the output coordinates are mapped to input coordinates once (in onnxruntime's
float32 arithmetic, upsamplebase.h), giving a small
[out, taps] table of indices and weights (1 tap nearest, 2 linear, 4 cubic); the axis is then a weighted
sum of ``np.take`` gathers (nearest upsampling by whole factors that repeats every element: one
broadcast copy). Neighbours outside the input repeat the edge (or get weight 0 with
``exclude_outside``); tf_crop_and_resize writes ``extrapolation_value`` where the mapped coordinate
leaves the input. Opset 10's Resize and Upsample use asymmetric coordinates and onnxruntime's legacy
nearest rounding (truncate, ceil when downsampling).

NOTE: ``antialias=1`` (opset 18) is delegated to onnx.reference's implementation (slow, imported
only then); onnxruntime follows the same filter.
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels._resize_linear import Linear2D, linear_taps
from onnx_prepared.kernels.registry import kernel, specializes

_F = np.float32
_C = np.float32  # coordinates, computed in float as onnxruntime does


def _coords(mode: str, n_out: int, n_in: int, scale: float, roi: tuple[float, float] | None,
            length: float) -> np.ndarray:
    """The original coordinate of each output index along one axis, in onnxruntime's arithmetic
    (upsamplebase.h: float32, half_pixel_symmetric's sum and a one-element tf_crop_and_resize in double)."""
    i = np.arange(n_out, dtype=_C)
    s = _C(scale)
    if mode == "half_pixel":
        return (i + _C(0.5)) / s - _C(0.5)
    if mode == "half_pixel_symmetric":
        adj = _C(n_out) / (s * _C(n_in))
        offset = _C(n_in) / _C(2) * (_C(1) - adj)
        return (np.float64(offset) + (i.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(_C)
    if mode == "pytorch_half_pixel":
        return (i + _C(0.5)) / s - _C(0.5) if n_out > 1 else np.zeros(n_out, _C)
    if mode == "align_corners":
        # NOTE: with scales, the resized length is in*scale unrounded, as onnx's reference and its node
        # tests have it; onnxruntime divides by the rounded output size, so the two differ when in*scale
        # is fractional (test_resize_align_corners_with_fractional_scales_follows_the_reference).
        return i * _C(n_in - 1) / _C(length - 1) if n_out > 1 else np.zeros(n_out, _C)
    if mode == "asymmetric":
        return i / s
    if mode == "tf_half_pixel_for_nn":
        return (i + _C(0.5)) / s
    if mode == "tf_crop_and_resize":
        start, end = _C(roi[0]), _C(roi[1])
        if n_out > 1:
            return start * _C(n_in - 1) + i * (end - start) * _C(n_in - 1) / _C(n_out - 1)
        return np.full(n_out, _C(0.5 * np.float64(start + end) * (n_in - 1)), _C)
    raise KernelError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest(x: np.ndarray, mode: str, down: bool) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.ceil(x - _C(0.5))
    if mode == "round_prefer_ceil":  # std::round, halves away from zero; floor(x + 0.5) rounds 0.49999997 up
        a = np.abs(x)
        r = np.floor(a)
        r += (a - r) >= _C(0.5)
        return np.copysign(r, x)
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    if mode == "legacy":  # onnxruntime's Upsample / Resize-10 rounding
        return np.ceil(x) if down else np.trunc(x)
    raise KernelError(f"Resize: unknown nearest_mode {mode!r}")


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    a = _C(a)
    d = np.stack([t + 1, t, 1 - t, 2 - t], axis=1)  # distances to the 4 taps
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, far)


def _table(mode, x, n_in, *, nearest_mode, down, cubic_coeff_a, exclude_outside):
    """(indices [out, taps], weights [out, taps] or None)."""
    if mode == "nearest":
        idx = np.clip(_nearest(x, nearest_mode, down), 0, n_in - 1).astype(np.int64)
        return idx[:, None], None
    if mode == "linear":
        i1, i2, d1, d2 = linear_taps(x, n_in)
        return np.stack([i1, i2], axis=1), np.stack([d2, d1], axis=1)
    if mode == "cubic":
        i0 = np.floor(x)
        w = _cubic_weights(x - i0, cubic_coeff_a)
        raw = i0.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
        if exclude_outside:
            w = np.where((raw >= 0) & (raw < n_in), w, 0)
            w = w / w.sum(axis=1, keepdims=True)
        return np.clip(raw, 0, n_in - 1), w
    raise KernelError(f"Resize: unknown mode {mode!r}")


@functools.lru_cache(maxsize=512)
def _axis_table(dtype: np.dtype, ndim: int, axis: int, n_in: int, n_out: int, scale: float, roi, length: float,
                ctm: str, mode: str, nearest_mode: str, cubic_coeff_a: float, exclude_outside: int):
    """(tap indices, tap weights shaped to broadcast along ``axis`` or None, outside mask or None) of one
    axis; cached: a model resizes the same shapes on every run (the table cost ~10 numpy calls per axis)."""
    x = _coords(ctm, n_out, n_in, scale, roi, length)
    idx, w = _table(mode, x, n_in, nearest_mode=nearest_mode, down=scale < 1, cubic_coeff_a=cubic_coeff_a,
                    exclude_outside=exclude_outside)
    shape = [1] * ndim
    shape[axis] = n_out
    taps = tuple(np.ascontiguousarray(idx[:, t]) for t in range(idx.shape[1]))
    weights = None if w is None else tuple(np.ascontiguousarray(w[:, t].astype(dtype)).reshape(shape)
                                           for t in range(w.shape[1]))
    outside = ((x < 0) | (x > n_in - 1)).reshape(shape) if roi is not None else None
    for a in (*taps, *(weights or ()), *((outside,) if outside is not None else ())):
        a.flags.writeable = False
    return taps, weights, outside


def _resize_axis(y: np.ndarray, axis: int, n_out: int, scale: float, roi, p: dict, length: float) -> np.ndarray:
    taps, weights, outside = _axis_table(y.dtype, y.ndim, axis, y.shape[axis], n_out, float(scale), roi,
                                         float(length), p["ctm"], p["mode"], p["nearest_mode"],
                                         float(p["cubic_coeff_a"]), int(p["exclude_outside"]))
    if weights is None:
        out = np.take(y, taps[0], axis=axis)
    else:
        out = None
        for idx, w in zip(taps, weights):
            term = np.take(y, idx, axis=axis)
            term *= w
            out = term if out is None else np.add(out, term, out=out)
    if outside is not None:
        out = np.where(outside, out.dtype.type(p["extrapolation_value"]), out)
    return out


@functools.lru_cache(maxsize=512)
def _repeat_factor(n_in: int, n_out: int, scale: float, length: float, ctm: str, nearest_mode: str) -> int:
    """``r`` when nearest resizing of this axis repeats every input element ``r`` times in order
    (``n_out = r * n_in``, index ``i // r``: a UNet's x2 upsampling), else 0."""
    if n_in < 1 or n_out % n_in:
        return 0
    r = n_out // n_in
    taps, _, _ = _axis_table(np.dtype(_F), 1, 0, n_in, n_out, scale, None, length, ctm, "nearest", nearest_mode,
                             -0.75, 0)
    return r if np.array_equal(taps[0], np.arange(n_out) // r) else 0


def _nearest_repeat(X: np.ndarray, out_shape, scales, rois, p, lengths) -> np.ndarray | None:
    """Nearest resizing that repeats elements along every resized axis as one broadcast copy (two
    gathers along the axes before: 115 -> ~15 us on 8x16x16 x2), or None."""
    reps = _repeats(X.shape, out_shape, scales, rois, p, lengths)
    return None if reps is None else _repeat_copy(X, reps, out_shape)


def _repeats(shape, out_shape, scales, rois, p, lengths) -> list[int] | None:
    """Per axis, how many times nearest resizing repeats each element (1: the axis is kept), or None
    when some axis is no whole repetition (or a roi crops)."""
    if any(r is not None for r in rois):
        return None
    reps = []
    for axis, n_in in enumerate(shape):
        n_out = out_shape[axis]
        r = 1 if n_out == n_in and scales[axis] == 1 else _repeat_factor(
            n_in, n_out, float(scales[axis]), float(lengths[axis]), p["ctm"], p["nearest_mode"])
        if not r:
            return None
        reps.append(r)
    return reps


def _repeat_copy(X: np.ndarray, reps: list[int], out_shape) -> np.ndarray:
    """``X`` with element ``i`` of axis ``a`` repeated ``reps[a]`` times (see :func:`_repeats`); the
    last two axes of 4-byte elements in one extension call (im2col.c nearest_repeat2d: 30 -> ~4 us on
    8x16x16 x2)."""
    ext = native._ext
    if (ext is not None and X.ndim >= 2 and X.dtype.itemsize == 4 and X.size and all(r == 1 for r in reps[:-2])
            and hasattr(ext, "nearest_repeat2d")):
        y = np.empty(out_shape, X.dtype)
        h, w = X.shape[-2:]
        ext.nearest_repeat2d(np.ascontiguousarray(X), y, np.array([X.size // (h * w), h, w, *reps[-2:]], np.int64))
        return y
    y = X
    if reps[-1] == 2 and X.dtype.itemsize == 4:
        # NOTE: numpy copies a stride-0 inner axis element by element (np.repeat too); two 32-bit
        # copies of each element are one uint64 built in three vector passes
        half = np.ascontiguousarray(X).view(np.uint32).astype(np.uint64)
        half |= half << np.uint64(32)
        y = half.view(X.dtype).reshape(X.shape[:-1] + (2 * X.shape[-1],))
    elif reps[-1] > 1:
        y = np.repeat(X, reps[-1], axis=-1)
    view, full = [], []
    for axis in range(X.ndim - 1):  # the other axes repeat whole contiguous rows
        view += [X.shape[axis], 1]
        full += [X.shape[axis], reps[axis]]
    if len(view) == 0 or all(r == 1 for r in reps[:-1]):
        return y if y is not X else X.copy()
    out = np.empty(tuple(full) + (y.shape[-1],), X.dtype)
    out[...] = y.reshape(tuple(view) + (y.shape[-1],))
    return out.reshape(out_shape)


def _linear2d(shape, dtype, out_shape, scales, rois, p, lengths) -> Linear2D | None:
    """The bilinear plan (:mod:`_resize_linear`) when this is a linear resizing of a float32 input's last
    two axes only (onnxruntime's ``UpsampleBilinear`` case), else None."""
    nd = len(shape)
    if (p["mode"] != "linear" or dtype != _F or nd < 2 or 0 in shape or 0 in out_shape
            or not all(_kept(a, shape, out_shape, scales, rois, p) for a in range(nd - 2))):
        return None
    xs = []
    for a in (nd - 2, nd - 1):
        if out_shape[a] == shape[a] and scales[a] == 1 and rois[a] is None:
            xs.append(np.arange(shape[a], dtype=_C))  # a kept axis: its own indices (onnxruntime's scale 1)
        else:
            xs.append(_coords(p["ctm"], int(out_shape[a]), int(shape[a]), float(scales[a]), rois[a],
                              float(lengths[a])))
    extrap = float(p["extrapolation_value"]) if p["ctm"] == "tf_crop_and_resize" else None
    return Linear2D(tuple(shape), tuple(int(d) for d in out_shape), xs[0], xs[1], extrap)


def _kept(axis: int, shape, out_shape, scales, rois, p) -> bool:
    """Whether resizing leaves this axis as it is: same length and scale 1, and a tf_crop_and_resize
    roi (if any) that maps every index onto itself (an exporter's 0..1 for N and C)."""
    n = shape[axis]
    if out_shape[axis] != n or scales[axis] != 1:
        return False
    roi = rois[axis]
    return roi is None or np.array_equal(_coords(p["ctm"], n, n, 1.0, roi, float(n)), np.arange(n, dtype=_C))


def resize_nd(X, out_shape, scales, rois, p, lengths) -> np.ndarray:
    dtype = X.dtype
    lin = _linear2d(X.shape, dtype, out_shape, scales, rois, p, lengths)
    if lin is not None:
        return lin(X)
    if p["mode"] == "nearest" and X.size:
        y = _nearest_repeat(X, out_shape, scales, rois, p, lengths)
        if y is not None:
            return y
    y = X if p["mode"] == "nearest" or (dtype.kind == "f" and dtype.itemsize >= 4) else X.astype(_F)
    for axis in range(X.ndim):
        n_out, roi = out_shape[axis], rois[axis]
        if n_out == X.shape[axis] and scales[axis] == 1 and roi is None:
            continue
        if X.shape[axis] == 0 or n_out == 0:
            y = np.zeros(y.shape[:axis] + (n_out,) + y.shape[axis + 1:], y.dtype)
            continue
        y = _resize_axis(y, axis, n_out, scales[axis], roi, p, lengths[axis])
    if y.dtype != dtype:
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            y = np.clip(np.rint(y), info.min, info.max)
        y = y.astype(dtype)
    return y


def _sizes_and_scales(X, scales, sizes, axes, policy: str):
    rank = X.ndim
    axes = list(range(rank)) if axes is None or len(axes) == 0 else [a + rank if a < 0 else a for a in axes]
    have_sizes = sizes is not None and np.size(sizes) > 0
    have_scales = scales is not None and np.size(scales) > 0
    if have_sizes == have_scales:
        raise KernelError("Resize: exactly one of scales and sizes must be given")
    out = list(X.shape)
    sc = [1.0] * rank
    if have_scales:
        vals = [float(v) for v in np.asarray(scales, _F).reshape(-1)]
        if len(vals) != len(axes) or any(v <= 0 for v in vals):
            raise KernelError(f"Resize: scales {vals} must be {len(axes)} positive values")
        for a, v in zip(axes, vals):
            sc[a] = v
            out[a] = int(np.floor(X.shape[a] * _F(v)))
        return out, sc, axes, [X.shape[a] * sc[a] for a in range(rank)]
    vals = [int(v) for v in np.asarray(sizes).reshape(-1)]
    if len(vals) != len(axes):
        raise KernelError(f"Resize: sizes {vals} must have {len(axes)} values")
    if policy in ("not_larger", "not_smaller"):
        ratios = [vals[j] / X.shape[a] for j, a in enumerate(axes)]
        r = min(ratios) if policy == "not_larger" else max(ratios)
        for a in axes:
            sc[a] = r
            out[a] = int(np.floor(X.shape[a] * r + 0.5))
        return out, sc, axes, out
    if policy != "stretch":
        raise KernelError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    for a, v in zip(axes, vals):
        out[a] = v
        sc[a] = v / X.shape[a] if X.shape[a] else 1.0
    return out, sc, axes, out


def _resize(X, roi, scales, sizes, *, antialias, axes, ctm, cubic_coeff_a, exclude_outside, extrapolation_value,
            keep_aspect_ratio_policy, mode, nearest_mode):
    if antialias and mode in ("linear", "cubic"):
        return _reference_antialias(X, roi, scales, sizes, axes=axes, ctm=ctm, cubic_coeff_a=cubic_coeff_a,
                                    exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                                    keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                                    nearest_mode=nearest_mode)
    return (resize_nd(X, *_plan(X, roi, scales, sizes, axes=axes, coordinate_transformation_mode=ctm,
                                cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                                extrapolation_value=extrapolation_value,
                                keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode,
                                nearest_mode=nearest_mode)),)


def _reference_antialias(X, roi, scales, sizes, **attrs):
    from onnx.reference.ops.op_resize import Resize as _RefResize

    fn = _RefResize._run  # uses nothing from self
    kw = {"antialias": 1, "axes": attrs["axes"], "coordinate_transformation_mode": attrs["ctm"],
          "cubic_coeff_a": attrs["cubic_coeff_a"], "exclude_outside": attrs["exclude_outside"],
          "extrapolation_value": attrs["extrapolation_value"],
          "keep_aspect_ratio_policy": attrs["keep_aspect_ratio_policy"], "mode": attrs["mode"],
          "nearest_mode": attrs["nearest_mode"]}
    return fn(None, X, roi, scales, sizes, **kw)


@kernel("Resize", since=11)
def resize(
    X: np.ndarray, roi: np.ndarray | None = None, scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None, *, antialias: int = 0, axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75, exclude_outside: int = 0,
    extrapolation_value: float = 0.0, keep_aspect_ratio_policy: str = "stretch", mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
) -> tuple[np.ndarray]:
    return _resize(X, roi, scales, sizes, antialias=antialias, axes=axes, ctm=coordinate_transformation_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, keep_aspect_ratio_policy=keep_aspect_ratio_policy,
                   mode=mode, nearest_mode=nearest_mode)


@specializes(resize)
def _resize_bound(consts: dict, n_inputs: int, **attrs):
    """Resize with its geometry planned once per input shape and roi/scales/sizes values: the constant
    ones (an exporter's Constant nodes) fixed at binding, the others (a Concat of constants that nothing
    folded: torch's UNet export) read per call and keyed by their bytes. A nearest resizing by whole
    factors also keeps its repeat factors (``_repeats`` built a coordinate table per axis on every
    call: UNet's 8x16x16 x2 76 -> ~10 us). At most 64 plans; then they start over."""
    if attrs.get("antialias", 0):
        return None
    varying = tuple(i for i in range(1, min(n_inputs, 4)) if i not in consts)
    fixed = [consts.get(i) for i in (1, 2, 3)]
    plans: dict = {}
    last: list = [None, None, None, None]  # shape, dtype, varying values' key, the plan

    def resize_bound(X: np.ndarray, *rest) -> tuple[np.ndarray]:
        vkey = [_value_key(rest[i - 1]) for i in varying] if varying else []
        if X.shape == last[0] and X.dtype is last[1] and vkey == last[2]:
            plan = last[3]
        else:
            key = (X.shape, X.dtype.char, *vkey)
            plan = plans.get(key)
            if plan is None:
                plan = _bound_plan(X, fixed, varying, rest, attrs)
                if len(plans) >= 64:
                    plans.clear()
                plans[key] = plan
            last[:] = (X.shape, X.dtype, vkey, plan)
        geo, reps, fast, lin = plan
        if fast is not None and fast[0] is native._ext and X.flags.c_contiguous:
            y = np.empty(fast[1], X.dtype)
            fast[0].nearest_repeat2d(X, y, fast[2])
            return (y,)
        if lin is not None:
            return (lin(X),)
        if reps is not None:
            return (_repeat_copy(X, reps, geo[0]),)
        return (resize_nd(X, *geo),)

    return resize_bound


def _bound_plan(X: np.ndarray, fixed: list, varying: tuple, rest: tuple, attrs: dict) -> tuple:
    """``(geometry, repeat factors or None, (extension, output shape, dims) or None, Linear2D or None)``
    for X's shape and these roi/scales/sizes: the third part when the call is one ``nearest_repeat2d`` of
    a C-contiguous X (what :func:`_repeat_copy` checks and builds per call, ~8 us of UNet's ~12 us
    Resize, settled here), the last one for a bilinear resizing (:func:`_linear2d`, its tables built
    here once)."""
    args = list(fixed)
    for i in varying:
        args[i - 1] = rest[i - 1]
    geo = _plan(X, *args, **attrs)
    reps = _repeats(X.shape, geo[0], geo[1], geo[2], geo[3], geo[4]) if (
        geo[3]["mode"] == "nearest" and X.size) else None
    ext, fast = native._ext, None
    if (reps is not None and ext is not None and X.ndim >= 2 and X.dtype.itemsize == 4 and X.size
            and all(r == 1 for r in reps[:-2]) and hasattr(ext, "nearest_repeat2d")):
        h, w = X.shape[-2:]
        fast = (ext, tuple(int(d) for d in geo[0]), np.array([X.size // (h * w), h, w, *reps[-2:]], np.int64))
    return geo, reps, fast, _linear2d(X.shape, X.dtype, *geo)


def _value_key(v) -> tuple | None:
    if type(v) is np.ndarray:  # the common case first: a tensor (~0.5 us; np.asarray's path ~0.75)
        return v.dtype, v.shape, v.tobytes()
    if v is None:
        return None
    a = np.asarray(v)
    return a.dtype, a.shape, a.tobytes()


def _plan(X, roi, scales, sizes, *, axes=None, coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
          exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
          nearest_mode="round_prefer_floor", antialias=0):
    """:func:`resize_nd`'s arguments for one input shape: output shape, scales, rois and the mode's
    parameters, checked once (the bound constant path keeps them per shape)."""
    out, sc, axes_l, lengths = _sizes_and_scales(X, scales, sizes, axes, keep_aspect_ratio_policy)
    rois = [None] * X.ndim
    if coordinate_transformation_mode == "tf_crop_and_resize":
        r = np.asarray(roi, np.float64).reshape(-1) if roi is not None and np.size(roi) else None
        if r is None or r.size != 2 * len(axes_l):
            raise KernelError(f"Resize: tf_crop_and_resize needs roi with {2 * len(axes_l)} values")
        for j, a in enumerate(axes_l):
            rois[a] = (float(r[j]), float(r[j + len(axes_l)]))
    if mode not in ("nearest", "linear", "cubic"):
        raise KernelError(f"Resize: unknown mode {mode!r}")
    p = {"ctm": coordinate_transformation_mode, "mode": mode, "nearest_mode": nearest_mode,
         "cubic_coeff_a": cubic_coeff_a, "exclude_outside": exclude_outside,
         "extrapolation_value": extrapolation_value}
    return out, sc, rois, p, lengths


def _legacy(X: np.ndarray, scales, mode: str) -> tuple[np.ndarray]:
    if mode not in ("nearest", "linear"):
        raise KernelError(f"Upsample/Resize-10: mode {mode!r} is not nearest or linear")
    return _resize(X, None, scales, None, antialias=0, axes=None, ctm="asymmetric", cubic_coeff_a=-0.75,
                   exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode=mode,
                   nearest_mode="legacy")


@kernel("Resize", since=10)
def resize_10(X: np.ndarray, scales: np.ndarray, *, mode: str = "nearest") -> tuple[np.ndarray]:
    return _legacy(X, scales, mode)


@kernel("Upsample", since=9)
def upsample_9(X: np.ndarray, scales: np.ndarray, *, mode: str = "nearest") -> tuple[np.ndarray]:
    return _legacy(X, scales, mode)


@kernel("Upsample", since=7)
def upsample_7(X: np.ndarray, *, mode: str = "nearest", scales: list[float]) -> tuple[np.ndarray]:
    return _legacy(X, np.asarray(scales, _F), mode)
