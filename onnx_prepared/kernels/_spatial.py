"""Geometry shared by the windowed kernels (Conv, ConvTranspose, pools): pads, output sizes, window views.

A window view of a padded input ``xp [N, C, *S]`` is an ``as_strided`` array ``[N, C, *out, *kernel]``
whose element ``[n, c, o..., k...]`` is ``xp[n, c, o*stride + k*dilation ...]``: no copy until a GEMM
or a reduction needs one.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from onnx_prepared.errors import KernelError

#: float dtypes numpy has no BLAS path for: computed in float32, cast back.
HALF = frozenset({"float16", "bfloat16"})


def work_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.name in HALF else dtype


def ints(v, n: int, default: int, what: str, op: str) -> tuple[int, ...]:
    """An ints attribute of length ``n`` (``default`` repeated when absent)."""
    if type(v) is tuple and len(v) == n and all(type(i) is int for i in v):
        return v
    if v is None or len(v) == 0:
        return (default,) * n
    v = tuple(int(i) for i in v)
    if len(v) != n:
        raise KernelError(f"{op}: {what}={list(v)} must have {n} values")
    return v


def _key(v):
    return None if v is None else tuple(v)


def geometry(op: str, in_shape: tuple[int, ...], kernel: tuple[int, ...], *, auto_pad: str, pads,
             strides, dilations, ceil_mode: int = 0, same_undilated: bool = False,
             ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(pad begins, pad ends, output sizes) of a windowed op, as onnxruntime computes them.

    Memoized per (shape, attributes): a steady run asks the same questions every time, and the
    arithmetic below cost ~13 us per Conv call (MobileNetV3 runs 52 of them).
    """
    return _geometry(op, tuple(in_shape), tuple(kernel), auto_pad, _key(pads), _key(strides), _key(dilations),
                     int(ceil_mode), bool(same_undilated))


@functools.lru_cache(maxsize=4096)
def _geometry(op: str, in_shape: tuple[int, ...], kernel: tuple[int, ...], auto_pad: str, pads, strides,
              dilations, ceil_mode: int, same_undilated: bool
              ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """geometry(), uncached.

    ``same_undilated``: SAME_* pads are computed from the undilated kernel and the output size from
    those pads (onnxruntime's pools).

    In ceil mode the pad ends may grow so the last (partial) window fits in the padded input; a
    window that would start in the end padding is dropped (onnxruntime's reduce-by-one rule).
    """
    nd = len(in_shape)
    strides = ints(strides, nd, 1, "strides", op)
    dilations = ints(dilations, nd, 1, "dilations", op)
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise KernelError(f"{op}: strides {list(strides)} and dilations {list(dilations)} must be >= 1")
    eff = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    begins, ends, out = [], [], []
    for i in range(nd):
        n, s, e = in_shape[i], strides[i], eff[i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + (kernel[i] if same_undilated else e) - n)
            small = total // 2
            b = small if auto_pad == "SAME_UPPER" else total - small
            begins.append(b)
            ends.append(total - b)
            out.append((n + total - e) // s + 1 if same_undilated else o)
            continue
        if auto_pad == "VALID":
            b = en = 0
        elif auto_pad in ("NOTSET", ""):
            p = ints(pads, 2 * nd, 0, "pads", op)
            b, en = p[i], p[i + nd]
        else:
            raise KernelError(f"{op}: unknown auto_pad {auto_pad!r}")
        span = n + b + en - e
        if span < 0:
            raise KernelError(f"{op}: kernel extent {e} is larger than the padded input {n + b + en} "
                              f"(input shape {list(in_shape)})")
        if ceil_mode:
            o = -(-span // s) + 1
            if (o - 1) * s >= n + b:
                o -= 1
        else:
            o = span // s + 1
        begins.append(b)
        ends.append(en)
        out.append(o)
    return tuple(begins), tuple(ends), tuple(out)


def pad_input(x: np.ndarray, begins, ends, out, kernel, strides, dilations, value) -> np.ndarray:
    """``x [N, C, *S]`` padded with ``value`` so every output window lies inside (ceil-mode ends grow,
    unused tail rows are cut)."""
    nd = len(begins)
    strides = ints(strides, nd, 1, "strides", "")
    dilations = ints(dilations, nd, 1, "dilations", "")
    need = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out, strides, dilations, kernel)]
    if all(b == 0 for b in begins) and all(nd_ == x.shape[2 + i] for i, nd_ in enumerate(need)):
        return x
    if all(b == 0 for b in begins) and all(nd_ <= x.shape[2 + i] for i, nd_ in enumerate(need)):
        return x[(slice(None), slice(None)) + tuple(slice(0, n) for n in need)]
    xp = np.full(x.shape[:2] + tuple(need), value, dtype=x.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for i in range(nd):
        n = x.shape[2 + i]
        lo, hi = max(0, -begins[i]), min(n, need[i] - begins[i])
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo + begins[i], max(lo, hi) + begins[i]))
    xp[tuple(dst)] = x[tuple(src)]
    return xp


def windows(xp: np.ndarray, out, kernel, strides, dilations) -> np.ndarray:
    """Read-only view ``[N, C, *out, *kernel]`` of the padded input's windows."""
    nd = len(out)
    strides = ints(strides, nd, 1, "strides", "")
    dilations = ints(dilations, nd, 1, "dilations", "")
    st = xp.strides
    shape = xp.shape[:2] + tuple(out) + tuple(kernel)
    view_strides = st[:2] + tuple(st[2 + i] * strides[i] for i in range(nd)) + tuple(
        st[2 + i] * dilations[i] for i in range(nd))
    return as_strided(xp, shape, view_strides, writeable=False)


def prod(v) -> int:
    return math.prod(int(i) for i in v)
