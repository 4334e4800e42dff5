"""Kernels specialized at binding for inputs folded Constant nodes give (registry.specializes): Slice's
index, Reshape's shape, Squeeze/Unsqueeze's axes are settled once. The specialized calls give
onnxruntime's values (views included, every run, several input shapes) and apply only when the
parameters are constants."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _const(name, values):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))


def _model(tmp_path, opset=17):
    nodes = [
        _const("st", [1, -1]), _const("en", [3, -100]), _const("ax", [0, 2]), _const("sp", [1, -2]),
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s1"]),
        _const("st2", [0]), _const("en2", [2]),
        helper.make_node("Slice", ["x", "st2", "en2"], ["s2"]),  # axes and steps omitted
        helper.make_node("Slice", ["x", "st2", "n"], ["s3"]),  # ends fed: not constant, not specialized
        _const("shp", [-1, 2]), helper.make_node("Reshape", ["s2", "shp"], ["r1"]),
        _const("shp0", [0, -1]), helper.make_node("Reshape", ["x", "shp0"], ["r2"]),  # 0 copies a dim
        _const("ua", [0, -1]), helper.make_node("Unsqueeze", ["s2", "ua"], ["u1"]),
        _const("sa", [0, -1]), helper.make_node("Squeeze", ["u1", "sa"], ["q1"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["a", "b", "c"]), helper.make_tensor_value_info("n", I64, [1])]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in ("s1", "s2", "s3", "r1", "r2", "u1", "q1")]
    g = helper.make_graph(nodes, "g", inputs, outputs)
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString())
    return str(path)


def test_constant_parameters_are_settled_at_binding_and_match_onnxruntime(tmp_path):
    path = _model(tmp_path)
    ours = onnx_prepared.InferenceSession(path)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = {a.kernel.call.__name__ if hasattr(a.kernel.call, "__name__") else a.kernel.call.func.__name__
             for a in ours._rt.plan.execution.actions}
    assert {"slice_const", "reshape_const", "reshape_copying", "unsqueeze_const", "squeeze_const"} <= names
    assert "slice_10" in names  # fed ends keep the plain kernel
    rng = np.random.default_rng(0)
    for shape in [(4, 3, 5), (4, 3, 5), (3, 2, 6)]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32), "n": np.array([2], np.int64)}
        for a, b in zip(ours.run(None, feeds), ref.run(None, feeds)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_a_bad_constant_parameter_still_fails_when_the_node_runs(tmp_path):
    nodes = [_const("ua", [0, 0]), helper.make_node("Unsqueeze", ["x", "ua"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2])],
                          [helper.make_tensor_value_info("y", F, None)])
    path = tmp_path / "bad.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    s = onnx_prepared.InferenceSession(str(path))
    with pytest.raises(onnx_prepared.errors.KernelError, match="duplicates"):
        s.run(None, {"x": np.zeros(2, np.float32)})


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_recurrent_nodes_bind_their_attributes_once(tmp_path, op):
    """LSTM/GRU/RNN nodes are bound to a call with their attributes settled (no keyword merge per run)
    and give onnxruntime's values, with and without the optional inputs."""
    rng = np.random.default_rng(1)
    g, h = {"LSTM": 4, "GRU": 3, "RNN": 1}[op], 5
    inits = [numpy_helper.from_array((rng.standard_normal((2, g * h, 3)) * 0.5).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((2, g * h, h)) * 0.5).astype(np.float32), "R"),
             numpy_helper.from_array(rng.standard_normal((2, 2 * g * h)).astype(np.float32), "B")]
    ins = ["x", "W", "R", "B", "", "h0"] + (["h0"] if op == "LSTM" else [])
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    nodes = [helper.make_node(op, ins, outs, hidden_size=h, direction="bidirectional", clip=5.0),
             helper.make_node(op, ["x", "W", "R"], ["y2"], hidden_size=h, direction="bidirectional")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4, 2, 3]),
                                           helper.make_tensor_value_info("h0", F, [2, 2, h])],
                              [helper.make_tensor_value_info(o, F, None) for o in [*outs, "y2"]], inits)
    path = tmp_path / "rnn.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString())
    ours = onnx_prepared.InferenceSession(str(path))
    assert [a.kernel.call.__name__ for a in ours._rt.plan.execution.actions] == ["rnn_layer"] * 2
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"x": rng.standard_normal((4, 2, 3)).astype(np.float32),
             "h0": rng.standard_normal((2, 2, h)).astype(np.float32)}
    for _ in range(2):
        for a, b in zip(ours.run(None, feeds), ref.run(None, feeds)):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_cast_binds_its_target_once_and_matches_onnxruntime(tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
             helper.make_node("Cast", ["b"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["x"], ["same"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["x"], ["s"], to=TensorProto.STRING)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4]),
                                       helper.make_tensor_value_info("b", TensorProto.BOOL, [4])],
                          [helper.make_tensor_value_info(o, t, None) for o, t in
                           (("i", TensorProto.INT32), ("f", F), ("same", F), ("s", TensorProto.STRING))])
    path = tmp_path / "cast.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    ours = onnx_prepared.InferenceSession(str(path))
    names = [getattr(a.kernel.call, "__name__", None) or a.kernel.call.func.__name__
             for a in ours._rt.plan.execution.actions]
    assert names == ["cast_to", "cast_to", "cast_to", "cast"]  # the string target keeps the kernel
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"x": np.array([1.5, -2.7, 3e9, 0.0], np.float32), "b": np.array([True, False, True, False])}
    with np.errstate(all="raise"):  # no warning escapes for the overflowing float -> int32
        got = ours.run(None, feeds)
    want = ref.run(None, feeds)
    for a, b in zip(got[:3], want[:3]):
        assert a.dtype == b.dtype
    np.testing.assert_array_equal(got[0][[0, 1, 3]], want[0][[0, 1, 3]])  # 3e9 is implementation-defined
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], feeds["x"])


def test_reduce_sum_with_known_axes_is_settled_at_binding(tmp_path):
    """ReduceSum-13 with omitted or constant axes gets its axes and keepdims settled once; float32 and
    int32 inputs, full and partial reductions, fed axes (the plain kernel) all give onnxruntime's values."""
    I32 = TensorProto.INT32
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["all0"], keepdims=0),
        helper.make_node("ReduceSum", ["x"], ["all1"]),
        _const("ax", [-1, 0]), helper.make_node("ReduceSum", ["x", "ax"], ["part"], keepdims=0),
        helper.make_node("ReduceSum", ["x", "ax"], ["part1"]),
        helper.make_node("ReduceSum", ["k", "ax"], ["ints"], keepdims=0),
        helper.make_node("ReduceSum", ["x", "fed"], ["fedsum"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, ["a", "b", "c"]), helper.make_tensor_value_info("k", I32, [2, 3]),
              helper.make_tensor_value_info("fed", I64, [1])]
    outputs = [helper.make_tensor_value_info(o, I32 if o == "ints" else F, None)
               for o in ("all0", "all1", "part", "part1", "ints", "fedsum")]
    g = helper.make_graph(nodes, "g", inputs, outputs)
    path = tmp_path / "sum.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    ours = onnx_prepared.InferenceSession(str(path))
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [a.kernel.call.__name__ if hasattr(a.kernel.call, "__name__") else a.kernel.call.func.__name__
             for a in ours._rt.plan.execution.actions]
    assert names.count("reduce_sum_f32") == 5 and names.count("reduce_sum_13") == 1
    rng = np.random.default_rng(1)
    for shape in [(2, 3, 4), (2, 3, 4), (1, 5, 2)]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32),
                 "k": rng.integers(-5, 5, (2, 3)).astype(np.int32), "fed": np.array([1], np.int64)}
        for a, b in zip(ours.run(None, feeds), ref.run(None, feeds)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
