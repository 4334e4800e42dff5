"""Elementwise arithmetic, comparison and logic kernels against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.kernels.onnx_node_check import check, run_ours

RNG = np.random.default_rng(1)

BINARY_ARITH = ["Add", "Sub", "Mul", "Div"]
COMPARE = [("Equal", 13), ("Less", 13), ("Greater", 13), ("LessOrEqual", 16), ("GreaterOrEqual", 16)]


def _rand(shape, dtype=np.float32, lo=-5, hi=6):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(lo if np.dtype(dtype).kind == "i" else max(lo, 0), hi, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


@settings(max_examples=25, derandomize=True, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       op=st.sampled_from(BINARY_ARITH + ["Pow"]))
def test_binary_broadcasting(shapes, op):
    a, b = (_rand(s) for s in shapes.input_shapes)
    if op == "Pow":
        a = np.abs(a) + 0.5
    (y,) = check(op, [a, b], opset=14, rtol=1e-6)
    assert y.shape == shapes.result_shape


@pytest.mark.parametrize("op", BINARY_ARITH)
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_binary_dtypes(op, dtype):
    a, b = _rand((3, 4), dtype), _rand((4,), dtype, lo=1, hi=5)
    if op == "Sub" and np.dtype(dtype).kind == "u":
        a = a + 5
    (y,) = check(op, [a, b], opset=14, rtol=1e-3 if dtype == np.float16 else 1e-6)
    assert y.dtype == dtype


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_integer_div_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0], dtype=dtype)
    b = np.array([2, 2, -2, -2, 3, -3, 5], dtype=dtype)
    (y,) = check("Div", [a, b], opset=14)
    np.testing.assert_array_equal(y, np.array([3, -3, -3, 3, 2, 2, 0], dtype=dtype))


def test_scalar_operands_give_0d_arrays():
    a, b = np.array(2.0, np.float32), np.array(3.0, np.float32)
    for op in BINARY_ARITH:
        (y,) = check(op, [a, b], opset=14)
        assert y.shape == () and y.dtype == np.float32


def test_float_division_by_zero():
    a = np.array([1.0, -1.0, 0.0], np.float32)
    (y,) = check("Div", [a, np.zeros(3, np.float32)], opset=14)
    assert np.isinf(y[0]) and np.isinf(y[1]) and np.isnan(y[2])


def test_empty_tensors():
    check("Add", [np.zeros((0, 3), np.float32), np.ones((3,), np.float32)], opset=14)
    check("Mul", [np.zeros((2, 0), np.float32), np.ones((1, 1), np.float32)], opset=7)


@pytest.mark.parametrize(
    ("a", "b"),
    [(np.float32, np.float32), (np.float32, np.int64), (np.float32, np.float64), (np.int64, np.int64),
     (np.int32, np.float32), (np.float16, np.float16)],
)
def test_pow_keeps_base_dtype(a, b):
    base = np.abs(_rand((3, 4), a)) + (1 if np.dtype(a).kind == "i" else 0.5)
    expo = np.array([2, 3, 0, 1], dtype=b) if np.dtype(b).kind == "i" else np.array([2, 0.5, -1, 3], dtype=b)
    if np.dtype(a).kind == "i" and np.dtype(b).kind == "f":
        expo = np.array([2, 1.5, 0, 3], dtype=b)
    (y,) = check("Pow", [base, expo], opset=15, rtol=1e-3 if a == np.float16 else 1e-6)
    assert y.dtype == a


def test_pow_square_fast_path_matches():
    x = _rand((5, 3))
    check("Pow", [x, np.array(2.0, np.float32)], opset=15)
    check("Pow", [x, np.array([2], np.int64)], opset=15)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_mod_integers(fmod, dtype):
    a = np.array([5, -5, 5, -5, 0, 7], dtype=dtype)
    b = np.array([3, 3, -3, -3, 2, 7], dtype=dtype)
    check("Mod", [a, b], opset=13, fmod=fmod)


def test_mod_float_fmod():
    check("Mod", [_rand((3, 4)), np.abs(_rand((4,))) + 0.5], opset=13, fmod=1)


VARIADIC = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add, "Mean": np.add}


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_variadic_same_shape(op, n):
    (y,) = check(op, [_rand((3, 4)) for _ in range(n)], opset=13, rtol=1e-6)
    assert y.dtype == np.float32


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize(
    "shapes",
    [[(3, 1, 4), (1, 2, 1)], [(3, 1, 4), (1, 2, 1), (4,)], [(4,), (4,), (2, 4)], [(), (3,), (2, 3), (2, 1)],
     [(), (), ()]],
)
def test_variadic_broadcasting(op, shapes):
    """Multidirectional broadcasting (opset 8+); the result may widen after the first pair.

    NOTE: onnx.reference accumulates in place into a copy of the first input and cannot widen, so the
    expectation here is plain numpy.
    """
    xs = [_rand(s) for s in shapes]
    (y,) = run_ours(op, xs, opset=13)
    expected = xs[0]
    for x in xs[1:]:
        expected = VARIADIC[op](expected, x)
    if op == "Mean":
        expected = expected / np.float32(len(xs))
    assert y.dtype == np.float32 and y.shape == np.broadcast_shapes(*shapes)
    np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_max_min_integers():
    check("Max", [_rand((3,), np.int64), _rand((2, 3), np.int64)], opset=13)
    check("Min", [_rand((3,), np.uint8), _rand((3,), np.uint8)], opset=13)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_unary(op, dtype):
    x = _rand((2, 3, 4), dtype)
    if op in ("Sqrt", "Log"):
        x = np.abs(x) + dtype(0.1)
    (y,) = check(op, [x], opset=13, rtol=1e-3 if dtype == np.float16 else 1e-6)
    assert y.dtype == dtype


def test_unary_edge_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 100.0, -1.0], np.float32)
    for op in ["Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log"]:
        check(op, [x], opset=13)
    check("Abs", [np.array([-3, 4], np.int32)], opset=13)
    check("Neg", [np.array(-3, np.int64)], opset=13)


@pytest.mark.parametrize(("op", "opset"), COMPARE)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_comparisons(op, opset, dtype):
    a = _rand((3, 4), dtype, -2, 3)
    b = _rand((4,), dtype, -2, 3)
    (y,) = check(op, [a, b], opset=opset)
    assert y.dtype == np.bool_


def test_equal_strings_and_bools():
    check("Equal", [np.array(["a", "b"], dtype=object), np.array(["a", "c"], dtype=object)], opset=19)
    check("Equal", [np.array([True, False]), np.array([True])], opset=13)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    a = RNG.integers(0, 2, (2, 3, 4)).astype(bool)
    b = RNG.integers(0, 2, (3, 1)).astype(bool)
    check(op, [a, b], opset=7)


def test_not():
    check("Not", [RNG.integers(0, 2, (3, 4)).astype(bool)], opset=1)
    check("Not", [np.array(True)], opset=1)


@pytest.mark.parametrize(("op", "opset"), [("Sin", 7), ("Cos", 7), ("Floor", 13), ("Ceil", 13), ("Round", 11),
                                           ("Sign", 13), ("IsNaN", 13), ("IsInf", 10)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_more_unary(op, opset, dtype):
    x = np.concatenate([_rand((20,), np.float32) * 3, [0.5, 1.5, 2.5, -0.5, -2.5, 0.0, -0.0]]).astype(dtype)
    check(op, [x], opset=opset, rtol=1e-3 if dtype == np.float16 else 1e-6)
    if op not in ("Sin", "Cos"):
        check(op, [np.array([np.inf, -np.inf, np.nan, 1.0], dtype)], opset=opset)


@pytest.mark.parametrize(("neg", "pos"), [(0, 1), (1, 0), (0, 0)])
def test_isinf_detect_flags(neg, pos):
    x = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    check("IsInf", [x], opset=10, detect_negative=neg, detect_positive=pos)


def test_sign_integers():
    check("Sign", [np.array([-3, 0, 5], np.int32)], opset=13)
    check("Sign", [np.array([0, 7], np.uint8)], opset=13)
