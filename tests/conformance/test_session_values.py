"""InferenceSession with non-tensor values and feed validation (the conformance suite's feeding path)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.errors import InvalidFeedError, ModelLoadError

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset=18):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _seq_len_model():
    seq = helper.make_tensor_sequence_value_info("s", F, [None])
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [])
    return _model([helper.make_node("SequenceLength", ["s"], ["n"])], [seq], [n])


def _optional_model():
    opt = helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2])))
    has = helper.make_tensor_value_info("has", TensorProto.BOOL, [])
    return _model([helper.make_node("OptionalHasElement", ["o"], ["has"])], [opt], [has])


def _two_outputs_model():
    x = helper.make_tensor_value_info("x", F, ["n", 3])
    outs = [helper.make_tensor_value_info(n, F, ["n", 3]) for n in ("neg", "abs")]
    return _model([helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Abs", ["x"], ["abs"])], [x], outs)


def test_sequence_feed_is_a_list_of_typed_tensors():
    sess = onnx_prepared.InferenceSession(_seq_len_model())
    assert sess.get_inputs()[0].type == "seq(tensor(float))"
    (n,) = sess.run(None, {"s": [np.zeros(2, np.float32), np.ones(5, np.float32)]})
    assert n == 2
    (n,) = sess.run(None, {"s": (np.zeros(1, np.float32),)})
    assert n == 1
    with pytest.raises(InvalidFeedError, match="'s' is a sequence"):
        sess.run(None, {"s": np.zeros(2, np.float32)})
    with pytest.raises(InvalidFeedError, match=r"'s\[1\]' has dtype float64"):
        sess.run(None, {"s": [np.zeros(2, np.float32), np.zeros(2)]})


def test_optional_feed_may_be_none():
    sess = onnx_prepared.InferenceSession(_optional_model())
    assert sess.get_inputs()[0].type == "optional(tensor(float))"
    assert sess.run(None, {"o": None})[0] == np.array(False)
    assert sess.run(None, {"o": np.zeros(2, np.float32)})[0] == np.array(True)
    with pytest.raises(InvalidFeedError, match="'o' has shape"):
        sess.run(None, {"o": np.zeros(3, np.float32)})


def test_tensor_feed_validation_names_the_feed():
    sess = onnx_prepared.InferenceSession(_two_outputs_model())
    ok = np.zeros((2, 3), np.float32)
    with pytest.raises(InvalidFeedError, match="missing input 'x'"):
        sess.run(None, {})
    with pytest.raises(InvalidFeedError, match="unknown input 'y'"):
        sess.run(None, {"x": ok, "y": ok})
    with pytest.raises(InvalidFeedError, match="'x' has dtype float64"):
        sess.run(None, {"x": ok.astype(np.float64)})
    with pytest.raises(InvalidFeedError, match="'x' has rank 1"):
        sess.run(None, {"x": np.zeros(3, np.float32)})
    with pytest.raises(InvalidFeedError, match=r"'x' has shape \[2, 4\].*dimension 1"):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(InvalidFeedError, match="'x' is a tensor; got None"):
        sess.run(None, {"x": None})


def test_output_names_select_and_order_outputs():
    sess = onnx_prepared.InferenceSession(_two_outputs_model())
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    a, n = sess.run(["abs", "neg"], {"x": x})
    np.testing.assert_array_equal(a, np.abs(x))
    np.testing.assert_array_equal(n, -x)
    assert [len(sess.run(names, {"x": x})) for names in (None, [], ["neg"])] == [2, 0, 1]
    with pytest.raises(InvalidFeedError, match="unknown output 'nope'"):
        sess.run(["nope"], {"x": x})


def test_model_from_bytes_proto_and_path_agree(tmp_path):
    model = _two_outputs_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    results = [onnx_prepared.InferenceSession(src).run(None, {"x": x}) for src in
               (model, model.SerializeToString(), path, str(path))]
    for r in results[1:]:
        for a, b in zip(r, results[0]):
            np.testing.assert_array_equal(a, b)


def test_malformed_bytes_are_a_load_error():
    with pytest.raises(ModelLoadError, match="malformed"):
        onnx_prepared.InferenceSession(b"\x0a\xff\xff\xff not a model")


def test_initializer_backed_input_is_overridable():
    w = onnx.numpy_helper.from_array(np.full(2, 10.0, np.float32), "w")
    x = helper.make_tensor_value_info("x", F, [2])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [x, helper.make_tensor_value_info("w", F, [2])], [helper.make_tensor_value_info("y", F, [2])],
                          [w])
    sess = onnx_prepared.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert [i.name for i in sess.get_overridable_initializers()] == ["w"]
    ones = np.ones(2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": ones})[0], [11.0, 11.0])
    np.testing.assert_array_equal(sess.run(None, {"x": ones, "w": ones})[0], [2.0, 2.0])
