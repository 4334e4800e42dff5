"""Native If, Loop and Scan (bind/control_flow.py) against onnxruntime at every opset version of the
ops: trip count and condition present or omitted, zero iterations, scan outputs, sequences carried, outer
scope values read from both enclosing graphs, If inside Loop, Scan axes and directions. None of it
reaches the fallback, and each body's plan is built once, at binding, never per run or per iteration."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.bind import FALLBACK_CALLS
from onnx_prepared.bind import graph as bind_graph

ort = pytest.importorskip("onnxruntime")

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
OPSETS = [11, 13, 16, 19, 21, 23]


def _vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, opset, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset < 21 else 10)


def _compare(model, feeds, opset):
    data = model.SerializeToString()
    try:
        ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as e:  # an opset this onnxruntime does not run yet
        pytest.skip(f"onnxruntime refuses opset {opset}: {type(e).__name__}")
    expected = ref.run(None, feeds)
    before = _control_fallbacks()
    sess = onnx_prepared.InferenceSession(data)
    kernels = [a.kernel.name for a in sess.runtime.plan.execution.actions]
    for _ in range(2):  # cold, then hot
        got = sess.run(None, feeds)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            if isinstance(e, list):
                assert len(g) == len(e)
                for a, b in zip(g, e):
                    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
            else:
                assert np.asarray(g).dtype == e.dtype and np.shape(g) == e.shape
                np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)
        sess.runtime.prepare()
    assert _control_fallbacks() == before, "a control-flow node went to the fallback"
    return kernels


def _control_fallbacks() -> int:
    return sum(v for k, v in FALLBACK_CALLS.items() if k.split("::")[-1].split("-")[0] in ("If", "Loop", "Scan"))


def _loop_body(scan: bool = True):
    """i, cond, acc -> cond' = (acc + i < 20), acc' = acc + x * i (x from the outer scope), scan: acc'."""
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
        helper.make_node("Identity", ["acc_out"], ["acc_copy"]),
        helper.make_node("Less", ["fi", "limit"], ["cond_out"]),
    ]
    outs = [_vi("cond_out", B, []), _vi("acc_out", F, [3])] + ([_vi("acc_copy", F, [3])] if scan else [])
    return helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [3])], outs)


X = np.array([1.0, -2.0, 0.5], np.float32)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("trip, cond", [(7, True), (7, None), (None, True), (0, True), (5, False)],
                         ids=["M+cond", "M-only", "cond-only", "zero-trips", "cond-false"])
def test_loop_against_onnxruntime(opset, trip, cond):
    loop = helper.make_node("Loop", ["M" if trip is not None else "", "c" if cond is not None else "", "acc0"],
                            ["acc", "accs"], body=_loop_body())
    inits = [helper.make_tensor("limit", F, [], [4.0])]
    inputs = [_vi("x", F, [3]), _vi("acc0", F, [3])]
    feeds = {"x": X, "acc0": np.zeros(3, np.float32)}
    if trip is not None:
        inputs.append(_vi("M", I64, []))
        feeds["M"] = np.array(trip, np.int64)
    if cond is not None:
        inputs.append(_vi("c", B, []))
        feeds["c"] = np.array(cond)
    outputs = [_vi("acc", F, [3]), _vi("accs", F, None)]  # zero trips: [0, 3] from the body's declared type
    kernels = _compare(_model([loop], inputs, outputs, opset, inits), feeds, opset)
    assert kernels == [f"control:ai.onnx::Loop-{opset}"]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("flag", [True, False])
def test_if_inside_loop_reads_both_enclosing_scopes(opset, flag):
    """The If's branches read the Loop body's value (acc_in), the main graph's (w) and the iteration."""
    then_b = helper.make_graph([helper.make_node("Mul", ["acc_in", "w"], ["t"])], "then", [], [_vi("t", F, [3])])
    else_b = helper.make_graph([helper.make_node("Cast", ["i"], ["fi"], to=F),
                                helper.make_node("Add", ["acc_in", "fi"], ["e"])], "else", [], [_vi("e", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["flag"], ["sel"]),
         helper.make_node("If", ["sel"], ["acc_out"], then_branch=then_b, else_branch=else_b),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [3])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [3])])
    loop = helper.make_node("Loop", ["M", "c", "acc0"], ["acc"], body=body)
    model = _model([loop], [_vi("acc0", F, [3]), _vi("w", F, [3]), _vi("flag", B, [])], [_vi("acc", F, [3])], opset,
                   [helper.make_tensor("M", I64, [], [4]), helper.make_tensor("c", B, [], [True])])
    feeds = {"acc0": X, "w": np.array([0.5, 2.0, -1.0], np.float32), "flag": np.array(flag)}
    assert _compare(model, feeds, opset) == [f"control:ai.onnx::Loop-{opset}"]


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_loop_swaps_and_passes_through_carried_values(opset):
    """The body's slot list is reused across iterations (filled once per Loop call): carried values that
    swap places, an input returned as it is, a constant as an output, and a scan output that is a
    carried input, all as onnxruntime gives them."""
    body = helper.make_graph(
        [helper.make_node("Add", ["a_in", "b_in"], ["a_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("a_in", F, [3]), _vi("b_in", F, [3]),
                 _vi("k_in", F, [])],
        [_vi("cond_out", B, []), _vi("a_out", F, [3]), _vi("a_in", F, [3]), _vi("kc", F, []), _vi("b_in", F, [3])],
        [helper.make_tensor("kc", F, [], [7.0])])
    loop = helper.make_node("Loop", ["M", "c", "a0", "b0", "k0"], ["a", "b", "kl", "bs"], body=body)
    model = _model([loop], [_vi("a0", F, [3]), _vi("b0", F, [3])],
                   [_vi("a", F, [3]), _vi("b", F, [3]), _vi("kl", F, []), _vi("bs", F, None)], opset,
                   [helper.make_tensor("M", I64, [], [5]), helper.make_tensor("c", B, [], [True]),
                    helper.make_tensor("k0", F, [], [0.0])])
    feeds = {"a0": X, "b0": np.array([0.5, 2.0, -1.0], np.float32)}
    assert _compare(model, feeds, opset) == [f"control:ai.onnx::Loop-{opset}"]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("flag", [True, False])
def test_if_against_onnxruntime(opset, flag):
    then_b = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("Neg", ["x"], ["t2"])],
                               "then", [], [_vi("t", F, [3]), _vi("t2", F, [3])])
    else_b = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["e"]),
                                helper.make_node("Identity", ["x"], ["e2"])], "else", [],
                               [_vi("e", F, [3]), _vi("e2", F, [3])],
                               [helper.make_tensor("k", F, [], [3.0])])
    node = helper.make_node("If", ["c"], ["y", "z"], then_branch=then_b, else_branch=else_b)
    model = _model([node], [_vi("c", B, [1]), _vi("x", F, [3])], [_vi("y", F, [3]), _vi("z", F, [3])], opset)
    assert _compare(model, {"c": np.array([flag]), "x": X}, opset) == [f"control:ai.onnx::If-{opset}"]


@pytest.mark.parametrize("opset", [13, 16, 19, 21, 23])
def test_loop_carries_a_sequence(opset):
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("SequenceInsert", ["seq_in", "xi"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []),
                 helper.make_tensor_sequence_value_info("seq_in", F, None)],
        [_vi("cond_out", B, []), helper.make_tensor_sequence_value_info("seq_out", F, None)])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
             helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body)]
    model = _model(nodes, [_vi("x", F, [3]), _vi("M", I64, [])], [helper.make_tensor_sequence_value_info("s", F, None)],
                   opset)
    _compare(model, {"x": X, "M": np.array(3, np.int64)}, opset)


def test_bodies_are_built_once_at_binding(monkeypatch):
    """No body plan is built while running: the plans exist once per node, from session creation."""
    loop = helper.make_node("Loop", ["M", "c", "acc0"], ["acc", "accs"], body=_loop_body())
    model = _model([loop], [_vi("x", F, [3]), _vi("acc0", F, [3])], [_vi("acc", F, [3]), _vi("accs", F, None)], 17,
                   [helper.make_tensor("limit", F, [], [100.0]), helper.make_tensor("M", I64, [], [6]),
                    helper.make_tensor("c", B, [], [True])])
    sess = onnx_prepared.InferenceSession(model.SerializeToString())
    built = []
    real = bind_graph.build_execution_plan
    monkeypatch.setattr(bind_graph, "build_execution_plan", lambda *a, **k: built.append(1) or real(*a, **k))
    feeds = {"x": X, "acc0": np.zeros(3, np.float32)}
    first = sess.run(None, feeds)
    sess.runtime.prepare()
    for _ in range(3):
        for a, b in zip(sess.run(None, feeds), first):
            np.testing.assert_array_equal(a, b)
    assert built == []
    np.testing.assert_allclose(first[0], X * sum(range(6)), rtol=1e-6)
    assert first[1].shape == (6, 3)


def test_a_bad_condition_is_a_kernel_error_naming_the_node():
    from onnx_prepared.errors import KernelError

    b = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "b", [], [_vi("t", F, [3])])
    node = helper.make_node("If", ["c"], ["y"], name="the_if", then_branch=b, else_branch=b)
    model = _model([node], [_vi("c", B, None), _vi("x", F, [3])], [_vi("y", F, [3])], 17)
    sess = onnx_prepared.InferenceSession(model.SerializeToString())
    with pytest.raises(KernelError, match=r"the_if.*single-element condition"):
        sess.run(None, {"c": np.array([True, False]), "x": X})


SCAN_OPSETS = [9, 11, 16, 19, 21, 23]


def _scan_model(opset, *, in_axis=0, in_dir=0, out_axis=0, out_dir=0):
    """state s [2], scan input xs [4, 2] (or [2, 4] along axis 1): s' = s + x_t * w (w outer), y_t = s' * 2."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "w"], ["xw"]), helper.make_node("Add", ["s_in", "xw"], ["s_out"]),
         helper.make_node("Add", ["s_out", "s_out"], ["y_t"])],
        "body", [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2]), _vi("y_t", F, [2])])
    attrs = {"num_scan_inputs": 1}
    if opset >= 9:
        if in_axis:
            attrs["scan_input_axes"] = [in_axis]
        if in_dir:
            attrs["scan_input_directions"] = [in_dir]
        if out_axis:
            attrs["scan_output_axes"] = [out_axis]
        if out_dir:
            attrs["scan_output_directions"] = [out_dir]
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, **attrs)
    shape = [2, 4] if in_axis in (1, -1) else [4, 2]
    return _model([node], [_vi("s0", F, [2]), _vi("xs", F, shape), _vi("w", F, [2])],
                  [_vi("s", F, [2]), _vi("ys", F, None)], opset), shape


@pytest.mark.parametrize("opset", SCAN_OPSETS)
@pytest.mark.parametrize("in_axis, in_dir, out_axis, out_dir",
                         [(0, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 1), (1, 1, 1, 0), (-1, 0, -1, 1)],
                         ids=["plain", "reverse-in", "reverse-out", "axes-1", "negative-axes"])
def test_scan_against_onnxruntime(opset, in_axis, in_dir, out_axis, out_dir):
    if opset < 11 and (in_axis < 0 or out_axis < 0):
        pytest.skip("negative axes arrive in Scan-11")
    model, shape = _scan_model(opset, in_axis=in_axis, in_dir=in_dir, out_axis=out_axis, out_dir=out_dir)
    rng = np.random.default_rng(5)
    feeds = {"s0": rng.standard_normal(2).astype(np.float32), "xs": rng.standard_normal(shape).astype(np.float32),
             "w": np.array([0.5, -1.5], np.float32)}
    assert _compare(model, feeds, opset) == [f"control:ai.onnx::Scan-{opset}"]


def test_outer_names_memo_answers_like_the_walk_and_computes_each_body_once(monkeypatch):
    """bind.scopes' memo (one per graph's FallbackEnv): the same outer names as the plain walk, a fresh
    set per answer (callers change it), and each body of a Loop holding an If walked once per session."""
    from onnx_prepared.bind import scopes

    then_b = helper.make_graph([helper.make_node("Add", ["v", "outer_a"], ["t"])], "then", [], [_vi("t")])
    else_b = helper.make_graph([helper.make_node("Mul", ["v", "outer_b"], ["e"])], "else", [], [_vi("e")])
    body = helper.make_graph(
        [helper.make_node("Add", ["c_in", "x"], ["v"]),
         helper.make_node("If", ["cond_in"], ["r"], then_branch=then_b, else_branch=else_b),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("c_in")], [_vi("cond_out", B, []), _vi("r")])
    loop = helper.make_node("Loop", ["n", "", "c0"], ["c_final"], body=body)
    memo: dict = {}
    plain = scopes.subgraph_outer_names(body)
    first = scopes.subgraph_outer_names(body, memo)
    assert first == plain == {"x", "outer_a", "outer_b"}
    first.add("changed")  # the memo keeps its own frozen copy
    assert scopes.subgraph_outer_names(body, memo) == plain
    assert scopes.implicit_inputs_of(loop, memo) == scopes.implicit_inputs_of(loop) == ("outer_a", "outer_b", "x")

    walked = []
    walk = scopes.subgraph_outer_names

    def counting(graph, memo=None):
        if memo is None or id(graph) not in memo:
            walked.append(graph.name)
        return walk(graph, memo)

    monkeypatch.setattr(scopes, "subgraph_outer_names", counting)
    monkeypatch.setattr(bind_graph, "subgraph_outer_names", counting)
    model = _model([loop], [_vi("n", I64, []), _vi("c0", F, [2]), _vi("x", F, [2]), _vi("outer_a", F, [2]),
                            _vi("outer_b", F, [2])], [_vi("c_final", F, [2])], 16)
    feeds = {"n": np.array(3, np.int64), "c0": np.array([1, 2], np.float32), "x": np.array([0.5, 1], np.float32),
             "outer_a": np.array([3, 4], np.float32), "outer_b": np.array([5, 6], np.float32)}
    _compare(model, feeds, 16)
    assert sorted(walked) == ["body", "else", "then"]
