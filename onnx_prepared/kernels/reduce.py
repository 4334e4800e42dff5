"""Reductions: ReduceSum/Mean/Max/Min/Prod/SumSquare over numpy's reductions.

Axes are an attribute before opset 18 (ReduceSum: before 13) and an optional input after. With the
input form, an empty or omitted ``axes`` reduces everything unless ``noop_with_empty_axes`` is set, in
which case the input passes through. Sums and products keep the input dtype (numpy would widen int32 to
int64); Max/Min of an empty reduction give the dtype's identity (-inf/+inf, int min/max, False/True).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnx_prepared.kernels.registry import kernel, specializes

_HALF = frozenset({"float16", "bfloat16"})


def _acc(x: np.ndarray) -> np.dtype:
    """Accumulator dtype: float32 for half types (more accurate), otherwise the input's own dtype."""
    # dtype.name costs ~1.5 us a call: only 2-byte dtypes ask for it
    return np.dtype(np.float32) if x.dtype.itemsize == 2 and x.dtype.name in _HALF else x.dtype


def _sum(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    # the ufunc's reduce itself: np.sum's Python wrapper costs about a microsecond a call
    return np.add.reduce(x, axis=axes, dtype=_acc(x), keepdims=keep).astype(x.dtype, copy=False)


def _mean(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    if x.size == 0:  # the mean of nothing is NaN; np.mean would also warn
        return np.full(np.sum(x, axis=axes, keepdims=keep).shape, np.nan, dtype=x.dtype)
    return np.mean(x, axis=axes, keepdims=keep, dtype=_acc(x)).astype(x.dtype, copy=False)


def _prod(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    return np.prod(x, axis=axes, keepdims=keep, dtype=x.dtype)


def _sum_square(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    sq = np.square(x.astype(_acc(x), copy=False))
    return np.sum(sq, axis=axes, keepdims=keep, dtype=sq.dtype).astype(x.dtype, copy=False)


def _extreme(ufunc: np.ufunc, lowest: bool) -> Callable:
    def reduce(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
        if x.size:
            return ufunc.reduce(x, axis=axes, keepdims=keep)
        if x.dtype == np.bool_:
            identity = not lowest
        elif x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            identity = info.min if lowest else info.max
        else:
            identity = -np.inf if lowest else np.inf
        return ufunc.reduce(x, axis=axes, keepdims=keep, initial=identity)

    return reduce


_max = _extreme(np.maximum, lowest=True)
_min = _extreme(np.minimum, lowest=False)


def _run(fn: Callable, x: np.ndarray, axes: list[int] | None, keepdims: int, noop: int) -> tuple[np.ndarray]:
    if not axes:
        if noop:
            return (x,)
        ax = None
    else:
        ax = tuple(axes)
    return (np.asarray(fn(x, ax, bool(keepdims))),)


def _axes_input(axes: np.ndarray | None) -> list[int] | None:
    return None if axes is None else axes.ravel().tolist()


# **** axes as an attribute (opset 1..12 for ReduceSum, 1..17 for the others) ****


@kernel("ReduceSum", since=1)
def reduce_sum_1(x: np.ndarray, *, axes: list[int] | None = None, keepdims: int = 1) -> tuple[np.ndarray]:
    return _run(_sum, x, axes, keepdims, 0)


@kernel("ReduceMean", since=1)
def reduce_mean_1(x: np.ndarray, *, axes: list[int] | None = None, keepdims: int = 1) -> tuple[np.ndarray]:
    return _run(_mean, x, axes, keepdims, 0)


@kernel("ReduceMax", since=1)
def reduce_max_1(x: np.ndarray, *, axes: list[int] | None = None, keepdims: int = 1) -> tuple[np.ndarray]:
    return _run(_max, x, axes, keepdims, 0)


@kernel("ReduceMin", since=1)
def reduce_min_1(x: np.ndarray, *, axes: list[int] | None = None, keepdims: int = 1) -> tuple[np.ndarray]:
    return _run(_min, x, axes, keepdims, 0)


@kernel("ReduceProd", since=1)
def reduce_prod_1(x: np.ndarray, *, axes: list[int] | None = None, keepdims: int = 1) -> tuple[np.ndarray]:
    return _run(_prod, x, axes, keepdims, 0)


@kernel("ReduceSumSquare", since=1)
def reduce_sum_square_1(x: np.ndarray, *, axes: list[int] | None = None, keepdims: int = 1) -> tuple[np.ndarray]:
    return _run(_sum_square, x, axes, keepdims, 0)


# **** axes as an optional input (ReduceSum from 13, the others from 18) ****


@kernel("ReduceSum", since=13)
def reduce_sum_13(
    x: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> tuple[np.ndarray]:
    return _run(_sum, x, _axes_input(axes), keepdims, noop_with_empty_axes)


@specializes(reduce_sum_13)
def _reduce_sum_bound(consts: dict, n_inputs: int, *, keepdims: int = 1, noop_with_empty_axes: int = 0):
    """ReduceSum whose axes binding knows (omitted, or a folded constant): a float32 input reduces in one
    ufunc call with the axes and keepdims settled (no keyword merge, no axes parsing, no dtype checks;
    a [3, 4] sum in a Loop body ran ~6 Python frames a call). Anything else calls the kernel."""
    if n_inputs >= 2 and 1 not in consts:
        return None
    axes = _axes_input(consts.get(1)) if n_inputs >= 2 else None
    if not axes and noop_with_empty_axes:
        return None
    ax = tuple(axes) if axes else None
    keep = bool(keepdims)
    f32 = np.dtype(np.float32)
    reduce, asarray = np.add.reduce, np.asarray
    attrs = {"keepdims": keepdims, "noop_with_empty_axes": noop_with_empty_axes}

    def reduce_sum_f32(x: np.ndarray, axes_in: np.ndarray | None = None) -> tuple[np.ndarray]:
        if type(x) is np.ndarray and x.dtype == f32:
            return (asarray(reduce(x, axis=ax, keepdims=keep)),)
        return reduce_sum_13(x, axes_in, **attrs)

    return reduce_sum_f32


@kernel("ReduceMean", since=18)
def reduce_mean_18(
    x: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> tuple[np.ndarray]:
    return _run(_mean, x, _axes_input(axes), keepdims, noop_with_empty_axes)


@kernel("ReduceMax", since=18)
def reduce_max_18(
    x: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> tuple[np.ndarray]:
    return _run(_max, x, _axes_input(axes), keepdims, noop_with_empty_axes)


@kernel("ReduceMin", since=18)
def reduce_min_18(
    x: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> tuple[np.ndarray]:
    return _run(_min, x, _axes_input(axes), keepdims, noop_with_empty_axes)


@kernel("ReduceProd", since=18)
def reduce_prod_18(
    x: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> tuple[np.ndarray]:
    return _run(_prod, x, _axes_input(axes), keepdims, noop_with_empty_axes)


@kernel("ReduceSumSquare", since=18)
def reduce_sum_square_18(
    x: np.ndarray, axes: np.ndarray | None = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
) -> tuple[np.ndarray]:
    """With ``noop_with_empty_axes`` and no axes the result is ``x * x`` (the op's function body; ORT agrees)."""
    ax = _axes_input(axes)
    if not ax and noop_with_empty_axes:
        return (np.asarray(np.square(x)),)
    return _run(_sum_square, x, ax, keepdims, 0)
