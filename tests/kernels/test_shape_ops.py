"""Shape and indexing kernels against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from onnx import TensorProto, helper

from tests.kernels.onnx_node_check import assert_same, check, run_ort, run_ours

RNG = np.random.default_rng(3)
I64 = np.int64
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _i(*v, dtype=I64):
    return np.array(v, dtype=dtype)


# **** Reshape / Flatten / Squeeze / Unsqueeze ****


@pytest.mark.parametrize(
    ("shape", "new"),
    [((2, 3, 4), (4, 6)), ((2, 3, 4), (0, -1)), ((2, 3, 4), (-1,)), ((2, 3, 4), (2, 0, 2, 2)), ((6,), (1, -1, 1)),
     ((1,), ()), ((0, 3), (-1, 3)), ((0, 3), (0, 1, 3))],
)
def test_reshape(shape, new):
    check("Reshape", [_rand(*shape), np.array(new, I64)], opset=14)


def test_reshape_allowzero_keeps_zero_dims():
    (y,) = check("Reshape", [_rand(0, 3), _i(3, 0)], opset=14, allowzero=1)
    assert y.shape == (3, 0)
    check("Reshape", [_rand(2, 3), _i(0, 3)], opset=5)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", [_rand(2, 3, 4)], opset=13, axis=axis)


@pytest.mark.parametrize(("axis", "expected"), [(0, (1, 0)), (1, (2, 0)), (2, (0, 4)), (3, (0, 1)), (-1, (0, 4))])
def test_flatten_empty(axis, expected):
    """onnx.reference cannot reshape an empty tensor with -1, so the expectation is written out."""
    (y,) = run_ours("Flatten", [_rand(2, 0, 4)], opset=13, axis=axis)
    assert y.shape == expected


def test_flatten_default_axis_old_opset():
    check("Flatten", [_rand(2, 3, 4)], opset=1)


@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 2], [2, 0, -2]])
def test_squeeze(axes):
    x = _rand(1, 3, 1, 1)
    if axes is not None and any(a in (-2,) for a in axes):
        x = _rand(1, 3, 1, 1, 1)
    attrs = {} if axes is None else {"axes": axes}
    check("Squeeze", [x], opset=11, **attrs)
    check("Squeeze", [x] + ([] if axes is None else [np.array(axes, I64)]), opset=13)


def test_squeeze_opset1_and_errors():
    check("Squeeze", [_rand(1, 3, 1)], opset=1, axes=[0])
    with pytest.raises(ValueError):
        run_ours("Squeeze", [_rand(2, 3), _i(0)], opset=13)


@pytest.mark.parametrize("axes", [[0], [-1], [0, 3], [1, -1], [0, -1]])
def test_unsqueeze(axes):
    x = _rand(3, 2)
    check("Unsqueeze", [x], opset=11, axes=axes)
    check("Unsqueeze", [x, np.array(axes, I64)], opset=13)


@pytest.mark.parametrize(
    ("axes", "expected"), [([3, 0], (1, 3, 2, 1)), ([-1, 0], (1, 3, 2, 1)), ([2, -4], (1, 3, 1, 2))]
)
def test_unsqueeze_unsorted_axes(axes, expected):
    """Axes may come in any order; onnx.reference inserts them one by one and fails, so shapes are spelled out."""
    (y,) = run_ours("Unsqueeze", [_rand(3, 2), np.array(axes, I64)], opset=13)
    assert y.shape == expected
    with pytest.raises(ValueError):
        run_ours("Unsqueeze", [_rand(3, 2), _i(0, -4)], opset=13)


def test_unsqueeze_scalar_and_opset1():
    check("Unsqueeze", [np.array(3.0, np.float32), _i(0)], opset=13)
    check("Unsqueeze", [_rand(2), ], opset=1, axes=[1])


# **** Transpose / Expand / Tile ****


@pytest.mark.parametrize("perm", [None, [0, 1, 2], [2, 0, 1], [1, 0, 2]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", [_rand(2, 3, 4)], opset=13, **attrs)


@pytest.mark.parametrize(
    ("shape", "target"),
    [((3, 1), (2, 1, 6)), ((3, 1), (3, 4)), ((1,), (2, 3)), ((2, 3), (1, 1)), ((2, 3), ()), ((), (2,)),
     ((1, 3), (0, 1))],
)
def test_expand(shape, target):
    (y,) = check("Expand", [_rand(*shape), np.array(target, I64)], opset=13)
    assert y.flags.writeable and y.flags.owndata


@pytest.mark.parametrize(("shape", "reps"), [((2, 3), (1, 2)), ((2, 3), (3, 1)), ((3,), (0,)), ((2, 1, 2), (2, 2, 2))])
def test_tile(shape, reps):
    check("Tile", [_rand(*shape), np.array(reps, I64)], opset=13)


# **** Gather / Concat / Split ****


@pytest.mark.parametrize(
    ("axis", "indices"),
    [(0, _i(0, 2, -1)), (1, _i(-4, 3)), (-1, _i([1, 0], [2, -3])), (0, np.array(-1, I64)), (2, np.array(1, I64)),
     (0, np.array([0, 1], np.int32)), (1, np.zeros((0,), I64))],
)
def test_gather(axis, indices):
    check("Gather", [_rand(3, 4, 5), indices], opset=13, axis=axis)


def test_gather_1d_scalar_index_gives_0d():
    (y,) = check("Gather", [_rand(5), np.array(-2, I64)], opset=13)
    assert y.shape == ()
    check("Gather", [np.array(["a", "b"], dtype=object), _i(1, 0)], opset=13)


def test_gather_out_of_range_raises():
    with pytest.raises(IndexError):
        run_ours("Gather", [_rand(3), _i(3)], opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    xs = [_rand(2, 3), _rand(2, 3), _rand(2, 3)]
    check("Concat", xs, opset=13, axis=axis)
    check("Concat", [_rand(0, 3), _rand(2, 3)] if axis == 0 else [_rand(2, 0), _rand(2, 3)], opset=11, axis=axis)


def test_concat_single_input_and_opset4():
    check("Concat", [_rand(2, 3)], opset=13, axis=0)
    check("Concat", [_rand(2, 3), _rand(2, 1)], opset=4, axis=1)


@pytest.mark.parametrize("opset", [2, 11])
def test_split_attribute_forms(opset):
    x = _rand(6, 4)
    check("Split", [x], opset=opset, n_outputs=3)
    check("Split", [x], opset=opset, n_outputs=2, axis=1, split=[1, 3])
    check("Split", [x], opset=opset, n_outputs=2, axis=0, split=[6, 0])


def test_split_13_input_and_even():
    x = _rand(6, 4)
    check("Split", [x, _i(2, 4)], opset=13, n_outputs=2)
    check("Split", [x], opset=13, n_outputs=2, axis=-1)
    check("Split", [x, None], opset=13, n_outputs=3)


@pytest.mark.parametrize(("dim", "n"), [(6, 3), (7, 3), (5, 2), (4, 4), (3, 1)])
def test_split_18_num_outputs(dim, n):
    outs = check("Split", [_rand(2, dim)], opset=18, n_outputs=n, axis=1, num_outputs=n)
    assert sum(o.shape[1] for o in outs) == dim


def test_split_bad_sizes_raise():
    with pytest.raises(ValueError):
        run_ours("Split", [_rand(6), _i(2, 2)], opset=13, n_outputs=2)


# **** Slice ****


SLICE_CASES = [
    # starts, ends, axes, steps
    ([0, 1], [2, 3], None, None),
    ([1], [INT64_MAX], [1], None),
    ([-3], [-1], [-1], None),
    ([INT64_MIN], [INT64_MAX], [0], [1]),
    ([-1], [INT64_MIN], [0], [-1]),
    ([10], [-10], [2], [-1]),
    ([4], [0], [2], [-2]),
    ([3], [-100], [1], [-1]),
    ([5], [1], [1], None),
    ([0, 0], [100, 100], [2, 0], [2, 3]),
    ([-100], [100], [-2], [1]),
    ([2], [2], [0], [1]),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICE_CASES)
def test_slice_10(starts, ends, axes, steps):
    x = _rand(3, 4, 5)
    inputs = [x, np.array(starts, I64), np.array(ends, I64)]
    inputs.append(None if axes is None else np.array(axes, I64))
    inputs.append(None if steps is None else np.array(steps, I64))
    while inputs[-1] is None:
        inputs.pop()
    check("Slice", inputs, opset=13)


def test_slice_int32_inputs_and_empty_axis():
    x = _rand(3, 0, 5)
    check("Slice", [x, np.array([1], np.int32), np.array([3], np.int32), np.array([2], np.int32)], opset=13)
    check("Slice", [x, _i(0), _i(-1), _i(1), _i(-1)], opset=13)


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), [c for c in SLICE_CASES if c[3] is None])
def test_slice_1_attributes(starts, ends, axes, steps):
    attrs = {"starts": starts, "ends": ends} | ({} if axes is None else {"axes": axes})
    check("Slice", [_rand(3, 4, 5)], opset=1, **attrs)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5), data=st.data())
def test_slice_random(shape, data):
    """Against onnxruntime: onnx.reference uses Python slicing, which differs from ONNX's clamping when a
    negative step meets a start below -dim (ONNX clamps it to 0 and still yields element 0)."""
    pytest.importorskip("onnxruntime")
    x = _rand(*shape)
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    bound = st.integers(-8, 8) | st.sampled_from([INT64_MAX, INT64_MIN])
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    inputs = [x, np.array(starts, I64), np.array(ends, I64), np.array(axes, I64), np.array(steps, I64)]
    assert_same(run_ours("Slice", inputs, opset=13), run_ort("Slice", inputs, opset=13))


def test_slice_backward_from_far_before_start_keeps_first_element():
    x = np.arange(5, dtype=np.float32)
    (y,) = run_ours("Slice", [x, _i(INT64_MIN), _i(INT64_MIN), _i(0), _i(-1)], opset=13)
    np.testing.assert_array_equal(y, [0.0])
    (y,) = run_ours("Slice", [x, _i(-1), _i(-7), _i(0), _i(-1)], opset=13)
    np.testing.assert_array_equal(y, [4, 3, 2, 1, 0])


# **** Shape / Size / Where / Range ****


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}, {"start": 3, "end": 1},
                                   {"start": -10}])
def test_shape(attrs):
    (y,) = check("Shape", [_rand(2, 3, 4)], opset=15, **attrs)
    assert y.dtype == np.int64


def test_shape_and_size_scalars():
    check("Shape", [np.array(1.0, np.float32)], opset=13)
    (y,) = check("Size", [_rand(2, 0, 4)], opset=13)
    assert y.shape == () and y.dtype == np.int64
    check("Size", [_rand(2, 3)], opset=1)


def test_where_broadcasting():
    cond = RNG.integers(0, 2, (2, 1, 4)).astype(bool)
    check("Where", [cond, _rand(3, 1), _rand(1, 4)], opset=16)
    check("Where", [np.array(True), np.array(1, I64), np.array(2, I64)], opset=9)


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dtype"),
    [(0, 10, 3, I64), (10, 0, -3, np.int32), (1, 1, 1, I64), (0.5, 3.0, 0.7, np.float32), (5.0, 1.0, -1.5, np.float64),
     (0, 5, -1, np.int16)],
)
def test_range(start, limit, delta, dtype):
    (y,) = check("Range", [np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)], opset=11)
    assert y.dtype == dtype


@pytest.mark.parametrize("stash_type", [None, TensorProto.FLOAT, TensorProto.DOUBLE])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32])
def test_range_27_stash_type(stash_type, dtype):
    attrs = {} if stash_type is None else {"stash_type": stash_type}
    inputs = [np.array(v, dtype) for v in ((1000, 1010, 3) if dtype == np.int32 else (1000.0, 1010.0, 2.5))]
    (y,) = check("Range", inputs, opset=27, **attrs)
    assert y.dtype == dtype


# **** Constant / ConstantOfShape ****


@pytest.mark.parametrize(
    "attrs",
    [{"value": helper.make_tensor("v", TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])},
     {"value": helper.make_tensor("v", TensorProto.INT64, [], [7])},
     {"value_float": 1.5}, {"value_floats": [1.0, 2.5]}, {"value_int": 3}, {"value_ints": [1, -2, 3]}],
)
def test_constant(attrs):
    check("Constant", [], opset=13, **attrs)


def test_constant_strings_are_object_arrays():
    """Like numpy_helper.to_array and onnxruntime (onnx.reference would give a '<U' array)."""
    (y,) = run_ours("Constant", [], opset=13, value_string="hi")
    assert y.dtype == object and y.shape == () and y.item() == "hi"
    (y,) = run_ours("Constant", [], opset=13, value_strings=["a", "bc"])
    assert y.dtype == object and y.tolist() == ["a", "bc"]


def test_constant_sparse_value():
    values = helper.make_tensor("v", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    for indices in (helper.make_tensor("i", TensorProto.INT64, [3], [0, 6, 11]),
                    helper.make_tensor("i", TensorProto.INT64, [3, 2], [0, 0, 1, 2, 2, 3])):
        sparse = helper.make_sparse_tensor(values, indices, [3, 4])
        (y,) = run_ours("Constant", [], opset=13, sparse_value=sparse)
        expected = np.zeros((3, 4), np.float32)
        expected.ravel()[[0, 6, 11]] = [1, 2, 3]
        np.testing.assert_array_equal(y, expected)


def test_constant_opset9():
    check("Constant", [], opset=9, value=helper.make_tensor("v", TensorProto.INT32, [2], [1, 2]))


@pytest.mark.parametrize(
    ("shape", "value"),
    [((2, 3), None), ((2, 3), helper.make_tensor("v", TensorProto.INT64, [1], [7])), ((0,), None), ((), None),
     ((3,), helper.make_tensor("v", TensorProto.BOOL, [1], [True]))],
)
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": value}
    check("ConstantOfShape", [np.array(shape, I64)], opset=21, **attrs)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 3), (0, 3)])
def test_trilu(upper, k, shape):
    inputs = [_rand(*shape)] + ([] if k is None else [np.array(k, I64)])
    check("Trilu", inputs, opset=14, upper=upper)


def test_slice_with_constant_parameters_computes_its_index_once_per_shape():
    """Read-only parameters (initializers, folded Constants) memoize the index per input shape; a
    writeable one (a feed) is read again each call, so changing it in place is seen."""
    from onnx_prepared.kernels import shape_ops

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    params = [np.array([1, -1], np.int64), np.array([3, -4], np.int64), np.array([2, 1], np.int64),
              np.array([1, -1], np.int64)]
    frozen = [p.copy() for p in params]
    for p in frozen:
        p.flags.writeable = False
    shape_ops._SLICES.clear()
    expected = x[:, -1:-4:-1, 1:3]
    for _ in range(2):
        np.testing.assert_array_equal(shape_ops.slice_10(x, *frozen)[0], expected)
    assert len(shape_ops._SLICES) == 1
    np.testing.assert_array_equal(shape_ops.slice_10(x[:1], *frozen)[0], x[:1, -1:-4:-1, 1:3])  # another shape
    assert len(shape_ops._SLICES) == 2
    np.testing.assert_array_equal(shape_ops.slice_10(x, *params)[0], expected)
    params[1][0] = 2  # a writeable end changed in place
    np.testing.assert_array_equal(shape_ops.slice_10(x, *params)[0], x[:, -1:-4:-1, 1:2])
    assert len(shape_ops._SLICES) == 2
