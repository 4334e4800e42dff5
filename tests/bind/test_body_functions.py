"""Loop bodies and If branches run as one generated function each (ExecutionPlan.function): the cases
its code generation treats apart, against onnxruntime (multi-output nodes, an output nothing reads, outputs
that are a body input or a constant, unused and unnamed inputs, If inside Loop inside
If), and a failing kernel inside a body is the KernelError naming that node and its inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.bind import control_flow
from onnx_prepared.errors import KernelError

ort = pytest.importorskip("onnxruntime")

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0


def _vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run_both(model, feeds):
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = onnx_prepared.InferenceSession(data)
    for _ in range(4):  # cold, then hot (the plans compile after their first replays)
        got = sess.run(None, feeds)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert np.asarray(g).dtype == e.dtype and np.shape(g) == e.shape
            np.testing.assert_array_equal(g, e)
    return sess


def _functions_built(monkeypatch) -> list:
    """Every body function the runs build (a Loop's whole-loop function, a branch's function)."""
    built = []
    for method in ("function", "loop"):
        real = getattr(control_flow._Slots, method)

        def spy(self, *args, _real=real):
            fn = _real(self, *args)
            built.append(fn)
            return fn

        monkeypatch.setattr(control_flow._Slots, method, spy)
    return built


def test_loop_body_with_multi_output_nodes_passthroughs_and_unused_inputs(monkeypatch):
    built = _functions_built(monkeypatch)
    body = helper.make_graph(
        [
            helper.make_node("Split", ["v_in"], ["a", "b"], axis=1, num_outputs=2),
            helper.make_node("TopK", ["a", "k"], ["top", "idx"], axis=1),  # idx: read by nothing
            helper.make_node("Concat", ["b", "top"], ["v_out"], axis=1),
            helper.make_node("Add", ["v_out", "w"], ["scan"]),
        ],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("v_in", F, [3, 4]), _vi("same_in", F, [2])],
        [_vi("cond_in", B, []), _vi("v_out", F, [3, 4]), _vi("same_in", F, [2]), _vi("scan", F, [3, 4]),
         _vi("k", I64, [1])],
        [helper.make_tensor("k", I64, [1], [2])],
    )
    loop = helper.make_node("Loop", ["M", "", "v0", "s0"], ["v", "s", "scans", "ks"], body=body)
    m = _model([loop], [_vi("M", I64, []), _vi("v0", F, [3, 4]), _vi("s0", F, [2]), _vi("w", F, [4])],
               [_vi("v", F, None), _vi("s", F, None), _vi("scans", F, None), _vi("ks", I64, None)], opset=18)
    feeds = {"M": np.array(3, np.int64), "v0": X, "s0": np.array([1.0, 2.0], np.float32),
             "w": np.array([0.5, -1.0, 2.0, 4.0], np.float32)}
    _run_both(m, feeds)
    assert built and all(fn is not None for fn in built)


def test_if_inside_loop_inside_if_reads_every_scope(monkeypatch):
    built = _functions_built(monkeypatch)
    then_b = helper.make_graph([helper.make_node("Mul", ["v_in", "w"], ["t"])], "then", [], [_vi("t", F, [3, 4])])
    else_b = helper.make_graph([helper.make_node("Sub", ["v_in", "one"], ["e"])], "else", [], [_vi("e", F, [3, 4])],
                               [helper.make_tensor("one", F, [], [1.0])])
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["v_in"], ["sum"], keepdims=0),
            helper.make_node("Greater", ["sum", "zero"], ["pos"]),
            helper.make_node("If", ["pos"], ["v_out"], then_branch=then_b, else_branch=else_b),
            helper.make_node("Identity", ["go"], ["cond_out"]),
        ],
        "body", [_vi("i", I64, []), _vi("c", B, []), _vi("v_in", F, [3, 4])],
        [_vi("cond_out", B, []), _vi("v_out", F, [3, 4])],
        [helper.make_tensor("zero", F, [], [0.0])],
    )
    outer_then = helper.make_graph([helper.make_node("Loop", ["M", "", "x"], ["y1"], body=body)], "ot", [],
                                   [_vi("y1", F, [3, 4])])
    outer_else = helper.make_graph([helper.make_node("Neg", ["x"], ["y2"])], "oe", [], [_vi("y2", F, [3, 4])])
    top = helper.make_node("If", ["flag"], ["y"], then_branch=outer_then, else_branch=outer_else)
    m = _model([top], [_vi("flag", B, []), _vi("M", I64, []), _vi("x", F, [3, 4]), _vi("w", F, [4]),
                       _vi("go", B, [])], [_vi("y", F, [3, 4])])
    for flag in (True, False):
        feeds = {"flag": np.array(flag), "M": np.array(4, np.int64), "x": X,
                 "w": np.array([0.5, -1.0, 2.0, 1.5], np.float32), "go": np.array(True)}
        _run_both(m, feeds)
    assert len(built) >= 3 and all(fn is not None for fn in built)


def test_a_failing_kernel_in_a_loop_body_names_the_node_and_its_inputs():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Reshape", ["v_in", "shape"], ["v_out"], name="bad_reshape")],
        "body", [_vi("i", I64, []), _vi("c", B, []), _vi("v_in", F, [3, 4])],
        [_vi("c_out", B, []), _vi("v_out", F, None)],
    )
    m = _model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="the_loop")],
               [_vi("M", I64, []), _vi("x", F, [3, 4]), _vi("shape", I64, [2])], [_vi("y", F, None)])
    sess = onnx_prepared.InferenceSession(m.SerializeToString())
    feeds = {"M": np.array(2, np.int64), "x": X, "shape": np.array([5, 5], np.int64)}
    for _ in range(4):  # the first replays and the compiled ones raise the same error
        with pytest.raises(KernelError, match=r"the_loop.*'bad_reshape' \(Reshape\).*float32\[3, 4\].*int64\[2\]"):
            sess.run(None, feeds)
