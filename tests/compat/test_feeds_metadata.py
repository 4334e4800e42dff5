"""Feeds and input/output metadata as onnxruntime has them (compared with onnxruntime where it agrees)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.errors import InvalidFeedError

F, I32, I64, B = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, opset=17):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _identity(elem, shape):
    return _model([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", elem, shape)],
                  [helper.make_tensor_value_info("y", elem, shape)])


def _both(model):
    return onnx_prepared.InferenceSession(model), ort.InferenceSession(model.SerializeToString())


def test_minus_one_dims_are_dynamic_and_shown_as_none():
    ours, ref = _both(_identity(F, [-1, 3, -1]))
    assert ours.get_inputs()[0].shape == ref.get_inputs()[0].shape == [None, 3, None]
    assert ours.get_outputs()[0].shape == ref.get_outputs()[0].shape
    for shape in ((2, 3, 5), (7, 3, 1)):
        x = np.ones(shape, np.float32)
        np.testing.assert_array_equal(ours.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    with pytest.raises(InvalidFeedError, match=r"dimension 1"):
        ours.run(None, {"x": np.ones((2, 4, 5), np.float32)})


@pytest.mark.parametrize("elem, value", [
    (I32, [1, 2, 3]), (I32, (4, 5, 6)), (I64, [[1, 2], [3, 4]]), (F, [0.1, 2.5, -3.0]), (F, [1, 2]),
    (B, [True, False]), (B, [0, 1]), (TensorProto.DOUBLE, [1.5]), (TensorProto.UINT8, [0, 255]),
    (TensorProto.FLOAT16, [0.5, 1.0]),
])
def test_lists_and_tuples_convert_to_the_declared_type_like_onnxruntime(elem, value):
    shape = list(np.shape(value))
    ours, ref = _both(_identity(elem, shape))
    # onnxruntime takes lists but not tuples ("a list of dictionaries or a single numpy array"): we take both
    got, want = ours.run(None, {"x": value})[0], ref.run(None, {"x": list(value)})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("elem, value", [
    (F, 2.5), (I64, 7), (I32, np.int64(3)), (F, np.float64(0.25)), (B, True), (I64, np.array(5, np.int64)[()]),
])
def test_scalars_and_numpy_scalars_convert(elem, value):
    # onnxruntime 1.32 rejects scalars ("Unable to handle object of type"); we convert them like lists
    ours, ref = _both(_identity(elem, []))
    typed = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(elem))
    got, want = ours.run(None, {"x": value})[0], ref.run(None, {"x": typed})[0]
    assert got.dtype == want.dtype and got.shape == () and got == want


@pytest.mark.parametrize("elem, value, why", [
    (I32, [1.5, 2.0], "float64 values to the declared int32"),
    (TensorProto.UINT8, [256], "int64 values to the declared uint8"),
    (I32, [2**40], "int64 values to the declared int32"),
    (B, [0, 2], "int64 values to the declared bool"),
    (F, [2**24 + 1], "int64 values to the declared float32"),
    (TensorProto.FLOAT16, [1e6], "float64 values to the declared float16"),
    (I64, [float("nan")], "float64 values to the declared int64"),
])
def test_lossy_conversions_raise(elem, value, why):
    sess = onnx_prepared.InferenceSession(_identity(elem, [len(value)]))
    with pytest.raises(InvalidFeedError, match=f"'x'.*{why}"):
        sess.run(None, {"x": value})


def test_ragged_lists_and_strings_for_numbers_raise():
    sess = onnx_prepared.InferenceSession(_identity(F, [None, None]))
    with pytest.raises(InvalidFeedError, match="'x'"):
        sess.run(None, {"x": [[1.0, 2.0], [3.0]]})
    with pytest.raises(InvalidFeedError, match="'x'"):
        sess.run(None, {"x": [["a", "b"]]})


def test_ndarrays_of_another_dtype_are_still_rejected_like_onnxruntime():
    sess = onnx_prepared.InferenceSession(_identity(I32, [3]))
    with pytest.raises(InvalidFeedError, match="dtype int64"):
        sess.run(None, {"x": np.arange(3)})


def test_output_shapes_merge_declared_and_inferred_like_onnxruntime():
    x = helper.make_tensor_value_info("x", F, ["n", None, 3])
    unknown = onnx.ValueInfoProto(name="u")
    unknown.type.tensor_type.elem_type = F
    for d in (None, 3, None):
        dim = unknown.type.tensor_type.shape.dim.add()
        if d:
            dim.dim_value = d
    outs = [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, [-1, "q", 3]),
            helper.make_tensor_value_info("w", F, []), unknown, helper.make_tensor_value_info("nz", I64, None),
            helper.make_tensor_value_info("r", F, ["a", "b", "c"])]
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"]),
             helper.make_node("ReduceSum", ["x"], ["w"], keepdims=0), helper.make_node("Abs", ["x"], ["u"]),
             helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Sigmoid", ["x"], ["r"])]
    ours, ref = _both(_model(nodes, [x], outs))
    assert [(o.name, o.shape, o.type) for o in ours.get_outputs()] == \
        [(o.name, o.shape, o.type) for o in ref.get_outputs()]
    assert ours.get_outputs()[0].shape == ["n", None, 3] and ours.get_outputs()[4].shape == [3, None]
    assert [(i.name, i.shape, i.type) for i in ours.get_inputs()] == \
        [(i.name, i.shape, i.type) for i in ref.get_inputs()]


def test_inputs_without_shape_show_an_empty_list():
    ours, ref = _both(_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, None)],
                             [helper.make_tensor_value_info("y", F, None)]))
    assert ours.get_inputs()[0].shape == ref.get_inputs()[0].shape == []
    assert ours.get_outputs()[0].shape == ref.get_outputs()[0].shape == []


def test_compiled_feed_checks_pass_exact_arrays_as_is_and_refuse_the_rest():
    """The per-input check compiled at construction: a plain ndarray of the declared dtype, rank and fixed
    dims is bound as is (no copy); everything else takes the full check, with its error."""
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F, [2, "n", -1]), helper.make_tensor_value_info("b", F, [1])],
        [helper.make_tensor_value_info("y", F, None)], [helper.make_tensor("b", F, [1], [1.0])])
    rt = onnx_prepared.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).runtime
    binder = rt._feeds
    x = np.zeros((2, 3, 4), np.float32)
    values, overridden = binder.bind({"x": x})
    slot = rt.plan.execution.slot_names.index("x")
    assert values[slot] is x and overridden == frozenset()
    values, overridden = binder.bind({"x": x, "b": np.full(1, 2.0, np.float32)})  # overrides the initializer
    assert len(overridden) == 1
    converted, _ = binder.bind({"x": x.tolist()})  # a list: converted to the declared float32
    assert converted[slot].dtype == np.float32 and converted[slot].shape == (2, 3, 4)
    for bad, match in [({"x": x.astype(np.float64)}, "dtype float64"), ({"x": x[0]}, "rank 2"),
                       ({"x": np.zeros((3, 3, 4), np.float32)}, "dimension 0"), ({}, "missing input 'x'"),
                       ({"b": np.ones(1, np.float32)}, "missing input 'x'"), ({"x": x, "z": x}, "unknown input 'z'"),
                       ({"x": np.zeros((2, 3, 4, 1), np.float32)}, "rank 4")]:
        with pytest.raises(InvalidFeedError, match=match):
            binder.bind(bad)


def test_compiled_feed_check_compares_every_fixed_dim_of_a_partly_dynamic_shape():
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", F, [3, "n", 5, -1])],
        [helper.make_tensor_value_info("y", F, None)])
    binder = onnx_prepared.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                                            ).runtime._feeds
    x = np.zeros((3, 7, 5, 2), np.float32)
    values, _ = binder.bind({"x": x})
    assert any(v is x for v in values)
    for shape, dim in [((3, 7, 4, 2), "dimension 2"), ((2, 7, 5, 2), "dimension 0")]:
        with pytest.raises(InvalidFeedError, match=dim):
            binder.bind({"x": np.zeros(shape, np.float32)})
