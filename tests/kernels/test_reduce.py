"""Reduction kernels against onnx.reference: both axes forms, keepdims, noop_with_empty_axes, empties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

from tests.kernels.onnx_node_check import check, run_ours

RNG = np.random.default_rng(4)
OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare"]
#: first opset where axes is an input
INPUT_SINCE = {"ReduceSum": 13} | {op: 18 for op in OPS if op != "ReduceSum"}


def _rand(shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(0 if np.dtype(dtype).kind == "u" else -3, 4, size=shape).astype(dtype)
    return (RNG.standard_normal(shape) * 0.8).astype(dtype)


def _run(op, x, axes, keepdims, *, input_form, noop=None, **kw):
    attrs = {"keepdims": keepdims} if keepdims is not None else {}
    if input_form:
        if noop is not None:
            attrs["noop_with_empty_axes"] = noop
        inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
        return check(op, inputs, opset=INPUT_SINCE[op], **attrs, **kw)
    if axes is not None:
        attrs["axes"] = axes
    return check(op, [x], opset=11, **attrs, **kw)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("input_form", [False, True])
@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 2], [2, 0], [1, -1]])
@pytest.mark.parametrize("keepdims", [None, 0, 1])
def test_reduce_axes_and_keepdims(op, input_form, axes, keepdims):
    _run(op, _rand((2, 3, 4)), axes, keepdims, input_form=input_form, rtol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_empty_axes_input(op, noop):
    x = _rand((2, 3))
    (y,) = check(op, [x, np.zeros((0,), np.int64)], opset=INPUT_SINCE[op], noop_with_empty_axes=noop, rtol=1e-5)
    if noop and op != "ReduceSumSquare":  # ReduceSumSquare's no-op still squares (function body, onnxruntime)
        assert y is x
    (y,) = _run(op, x, None, 0, input_form=True, noop=noop, rtol=1e-5)
    assert y.shape == ((2, 3) if noop else ())


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float16, np.float64])
def test_reduce_keeps_dtype(op, dtype):
    x = _rand((3, 4), dtype)
    if op == "ReduceSumSquare" and dtype in (np.int32, np.uint8):
        # onnx.reference widens these to 64 bits (np.sum's default), breaking the T -> T contract.
        (y,) = run_ours(op, [x, np.array([1], np.int64)], opset=18, keepdims=0)
        np.testing.assert_array_equal(y, (x.astype(np.int64) ** 2).sum(axis=1).astype(dtype))
    else:
        tol = 5e-3 if dtype == np.float16 else 1e-6
        (y,) = _run(op, x, [1], 0, input_form=True, rtol=tol, atol=tol)
    assert y.dtype == dtype


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool(op):
    x = RNG.integers(0, 2, (3, 4)).astype(bool)
    check(op, [x, np.array([1], np.int64)], opset=20, keepdims=0)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_reduce_empty_reduced_axis(op, dtype):
    """Reducing a zero-length axis gives the op's identity: 0, 1, -inf/+inf (int min/max), NaN for Mean."""
    if op == "ReduceMean" and dtype == np.int64:
        pytest.skip("integer mean of nothing is undefined")
    x = np.zeros((2, 0, 3), dtype)
    (y,) = run_ours(op, [x, np.array([1], np.int64)], opset=INPUT_SINCE[op], keepdims=1)
    assert y.shape == (2, 1, 3) and y.dtype == dtype
    if op != "ReduceMean":
        check(op, [x, np.array([1], np.int64)], opset=INPUT_SINCE[op], keepdims=1)
    else:
        assert np.isnan(y).all()


def test_reduce_empty_input_other_axis():
    for op in OPS:
        check(op, [np.zeros((0, 3), np.float32), np.array([1], np.int64)], opset=INPUT_SINCE[op], keepdims=0)


def test_reduce_scalar_result_is_0d_array():
    for op in OPS:
        (y,) = _run(op, _rand((3,)), None, 0, input_form=True, rtol=1e-5)
        assert isinstance(y, np.ndarray) and y.shape == ()


def test_reduce_sum_float16_accumulates_in_float32():
    x = np.full(4096, 0.1, np.float16)
    (y,) = run_ours("ReduceSum", [x], opset=13, keepdims=0)
    assert y.dtype == np.float16
    assert abs(float(y) - 409.5) < 0.5  # float16 accumulation would stall far below


@settings(max_examples=40, derandomize=True, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=4, max_side=4), data=st.data())
def test_reduce_random(shape, data):
    op = data.draw(st.sampled_from(OPS))
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    keepdims = data.draw(st.sampled_from([0, 1]))
    _run(op, _rand(shape), axes or None, keepdims, input_form=data.draw(st.booleans()), rtol=1e-5, atol=1e-6)
