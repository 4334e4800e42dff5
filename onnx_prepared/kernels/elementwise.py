"""Elementwise arithmetic, comparison and logic ops as single numpy ufunc calls.

ONNX requires both operands of a binary op to share a dtype, so a ufunc keeps that dtype without
promotion. ``np.asarray`` turns the numpy scalars that 0-d operands produce back into 0-d arrays.
Registered from opset 7 (multidirectional broadcasting); older versions carry ``broadcast``/``axis``
attributes and go through the fallback.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.kernels.registry import kernel, specializes

# **** binary arithmetic ****


@kernel("Add", since=7)
def add(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.add(a, b)),)


@kernel("Sub", since=7)
def sub(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.subtract(a, b)),)


@kernel("Mul", since=7)
def mul(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.multiply(a, b)),)


@kernel("Div", since=7)
def div(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    """Integer division truncates toward zero (C semantics), unlike numpy's floor division."""
    if a.dtype.kind == "i":
        q, r = np.divmod(a, b)
        # floor -> trunc: bump the quotient where the remainder is non-zero and the signs differ.
        q += (r != 0) & ((a < 0) ^ (b < 0))
        return (np.asarray(q),)
    if a.dtype.kind == "u":
        return (np.asarray(np.floor_divide(a, b)),)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(np.divide(a, b)),)


@specializes(div)
def _div_const(consts: dict, n_inputs: int):
    """A constant float divisor with no zero, inf or NaN: a plain ``np.divide`` (the quotient of a
    float by such a divisor raises neither the divide nor the invalid flag, so the errstate block,
    ~4.5 us of a 6.5 us call on an attention score, has nothing to silence)."""
    b = consts.get(1)
    if not isinstance(b, np.ndarray) or b.dtype.kind != "f" or not b.size or not np.all(np.isfinite(b) & (b != 0)):
        return None

    def div_const(a: np.ndarray, b_: np.ndarray) -> tuple[np.ndarray]:
        return (np.asarray(np.divide(a, b)),)

    return div_const


@kernel("Pow", since=7)
def pow_(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    """The result has the base's dtype; the exponent may have another type (opset 12+)."""
    if a.dtype.kind == "f" and b.size == 1 and b.dtype.kind in "fiu" and b.ravel()[0] == 2:
        return (np.asarray(np.square(a)),)  # the common x**2, exact and several times faster
    with np.errstate(all="ignore"):
        y = np.asarray(np.power(a, b))
    return (y if y.dtype == a.dtype else y.astype(a.dtype),)


@kernel("Mod", since=10)
def mod(a: np.ndarray, b: np.ndarray, *, fmod: int = 0) -> tuple[np.ndarray]:
    """``fmod=1``: sign of the dividend (C fmod); ``fmod=0``: sign of the divisor (integers only)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.fmod(a, b) if fmod else np.mod(a, b)
    return (np.asarray(y),)


# **** variadic ****


def _variadic(ufunc: np.ufunc, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    if len(inputs) == 1:
        return inputs[0]
    y = np.asarray(ufunc(inputs[0], inputs[1]))  # fresh (0-d results come back as scalars)
    for x in inputs[2:]:
        if y.shape == np.broadcast_shapes(y.shape, x.shape):
            ufunc(y, x, out=y)  # y is fresh and already has the final shape: no new buffer
        else:
            y = np.asarray(ufunc(y, x))
    return y


@kernel("Max", since=8)
def max_(*inputs: np.ndarray) -> tuple[np.ndarray]:
    return (_variadic(np.maximum, inputs),)


@kernel("Min", since=8)
def min_(*inputs: np.ndarray) -> tuple[np.ndarray]:
    return (_variadic(np.minimum, inputs),)


@kernel("Sum", since=8)
def sum_(*inputs: np.ndarray) -> tuple[np.ndarray]:
    return (_variadic(np.add, inputs),)


@kernel("Mean", since=8)
def mean(*inputs: np.ndarray) -> tuple[np.ndarray]:
    y = _variadic(np.add, inputs)
    if y is inputs[0]:
        return (y,)
    y /= np.asarray(len(inputs), dtype=y.dtype)
    return (y,)


# **** unary ****


@kernel("Neg", since=6)
def neg(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.negative(x)),)


@kernel("Abs", since=6)
def abs_(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.abs(x)),)


@kernel("Sqrt", since=6)
def sqrt(x: np.ndarray) -> tuple[np.ndarray]:
    with np.errstate(invalid="ignore"):
        return (np.asarray(np.sqrt(x)),)


@kernel("Reciprocal", since=6)
def reciprocal(x: np.ndarray) -> tuple[np.ndarray]:
    with np.errstate(divide="ignore"):
        return (np.asarray(np.reciprocal(x)),)


@kernel("Exp", since=6)
def exp(x: np.ndarray) -> tuple[np.ndarray]:
    with np.errstate(over="ignore"):
        return (np.asarray(np.exp(x)),)


@kernel("Log", since=6)
def log(x: np.ndarray) -> tuple[np.ndarray]:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(np.log(x)),)


@kernel("Sin", since=7)
def sin(x: np.ndarray) -> tuple[np.ndarray]:
    with np.errstate(invalid="ignore"):
        return (np.asarray(np.sin(x)),)


@kernel("Cos", since=7)
def cos(x: np.ndarray) -> tuple[np.ndarray]:
    with np.errstate(invalid="ignore"):
        return (np.asarray(np.cos(x)),)


@kernel("Floor", since=6)
def floor(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.floor(x)),)


@kernel("Ceil", since=6)
def ceil(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.ceil(x)),)


@kernel("Round", since=11)
def round_(x: np.ndarray) -> tuple[np.ndarray]:
    """Halves round to even, as ``np.round`` does."""
    return (np.asarray(np.round(x)),)


@kernel("Sign", since=9)
def sign(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.sign(x)),)


@kernel("IsNaN", since=9)
def isnan(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.isnan(x)),)


@kernel("IsInf", since=10)
def isinf(x: np.ndarray, *, detect_negative: int = 1, detect_positive: int = 1) -> tuple[np.ndarray]:
    if detect_negative and detect_positive:
        return (np.asarray(np.isinf(x)),)
    if detect_positive:
        return (np.asarray(np.isposinf(x)),)
    if detect_negative:
        return (np.asarray(np.isneginf(x)),)
    return (np.zeros(np.shape(x), dtype=bool),)


# **** comparison and logic (bool results) ****


@kernel("Equal", since=7)
def equal(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.equal(a, b)),)


@kernel("Less", since=7)
def less(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.less(a, b)),)


@kernel("Greater", since=7)
def greater(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.greater(a, b)),)


@kernel("LessOrEqual", since=12)
def less_or_equal(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.less_equal(a, b)),)


@kernel("GreaterOrEqual", since=12)
def greater_or_equal(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.greater_equal(a, b)),)


@kernel("And", since=7)
def and_(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.logical_and(a, b)),)


@kernel("Or", since=7)
def or_(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.logical_or(a, b)),)


@kernel("Xor", since=7)
def xor(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.logical_xor(a, b)),)


@kernel("Not", since=1)
def not_(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.logical_not(x)),)
