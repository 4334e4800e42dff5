"""The onnx.reference fallback beyond single nodes: outer-scope values reaching subgraphs, model-local
functions, context-dependent function ops, other domains, and the named/counted path.

Results are checked against numpy and, where installed, against onnxruntime on the same model.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.bind import FALLBACK_CALLS, FallbackEnv, bind_fallback, bind_node
from onnx_prepared.errors import KernelError, UnsupportedOpError

F = TensorProto.FLOAT


def _vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, opset=17, functions=(), extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    ops = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(g, opset_imports=ops, functions=list(functions))


def _run(model, feeds):
    return onnx_prepared.InferenceSession(model.SerializeToString()).run(None, feeds)


def _check_against_ort(model, feeds, got):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for a, b in zip(got, sess.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _bool(name, value):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.BOOL, [], [value]))


def _i64(name, value):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [value]))


# ---- outer-scope values in subgraphs ----


def _loop_model():
    # w = -x (outer); v_{k+1} = v_k + w, scanned each step; three iterations.
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "w"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("v_in", F, [2])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", F, [2]), _vi("scan_out", F, [2])],
    )
    nodes = [helper.make_node("Neg", ["x"], ["w"]), _i64("M", 3), _bool("c", True),
             helper.make_node("Loop", ["M", "c", "x"], ["v", "scans"], body=body)]
    return _model(nodes, [_vi("x", F, [2])], [_vi("v", F, [2]), _vi("scans", F, [3, 2])])


def test_loop_body_reads_outer_scope_value():
    model = _loop_model()
    x = np.array([1.0, -2.0], np.float32)
    v, scans = got = _run(model, {"x": x})
    np.testing.assert_allclose(v, x - 3 * x)
    np.testing.assert_allclose(scans, np.stack([x - x, x - 2 * x, x - 3 * x]))
    _check_against_ort(model, {"x": x}, got)


def test_loop_scalar_scan_outputs_stack_to_one_axis():
    # onnx.reference vstacks per-iteration scalars into [n, 1]; the spec (and onnxruntime) give [n].
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["f"], to=F), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, [])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("f", F, [])])
    nodes = [_bool("c", True), helper.make_node("Loop", ["n", "c"], ["ys"], body=body)]
    model = _model(nodes, [_vi("n", TensorProto.INT64, [])], [_vi("ys", F, [None])])
    (ys,) = got = _run(model, {"n": np.array(4, np.int64)})
    np.testing.assert_array_equal(ys, [0.0, 1.0, 2.0, 3.0])
    _check_against_ort(model, {"n": np.array(4, np.int64)}, got)


def test_scan_body_reads_outer_scope_value():
    # running sum of xs[t] * scale, where scale is computed outside the Scan
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "scale"], ["m"]), helper.make_node("Add", ["s_in", "m"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2]), _vi("y_t", F, [2])])
    nodes = [helper.make_node("Add", ["k", "k"], ["scale"]),
             helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1)]
    model = _model(nodes, [_vi("k", F, [2]), _vi("s0", F, [2]), _vi("xs", F, [3, 2])],
                   [_vi("s", F, [2]), _vi("ys", F, [3, 2])])
    feeds = {"k": np.array([0.5, 1.0], np.float32), "s0": np.zeros(2, np.float32),
             "xs": np.arange(6, dtype=np.float32).reshape(3, 2)}
    s, ys = got = _run(model, feeds)
    expected = np.cumsum(feeds["xs"] * 2 * feeds["k"], axis=0)
    np.testing.assert_allclose(ys, expected)
    np.testing.assert_allclose(s, expected[-1])
    _check_against_ort(model, feeds, got)


def test_if_inside_loop_reads_values_from_both_enclosing_scopes():
    # The If reads `w` (main graph, two scopes up) and `v_in` (the loop body, one scope up).
    then_g = helper.make_graph([helper.make_node("Add", ["v_in", "w"], ["r"])], "then", [], [_vi("r", F, [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["v_in", "w"], ["r2"])], "else", [], [_vi("r2", F, [2])])
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["odd_i"], to=TensorProto.BOOL),  # i = 0 -> False, 1 -> True
         helper.make_node("If", ["odd_i"], ["v_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("v_in", F, [2])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", F, [2])])
    nodes = [helper.make_node("Mul", ["x", "x"], ["w"]), _i64("M", 2), _bool("c", True),
             helper.make_node("Loop", ["M", "c", "x"], ["v"], body=body)]
    model = _model(nodes, [_vi("x", F, [2])], [_vi("v", F, [2])])
    x = np.array([2.0, 3.0], np.float32)
    (v,) = got = _run(model, {"x": x})
    np.testing.assert_allclose(v, x)  # iteration 0 subtracts w, iteration 1 adds it back
    _check_against_ort(model, {"x": x}, got)
    plan = onnx_prepared.InferenceSession(model).runtime.plan.execution
    (loop,) = [a for a in plan.actions if a.kernel.name.endswith("Loop-17")]
    assert loop.kernel.implicit_inputs == ("w",)


def test_sequence_map_body_reads_outer_scope_value():
    # SequenceMap's body takes no context argument in onnx.reference: the adapter scopes it.
    body = helper.make_graph([helper.make_node("Add", ["e", "w"], ["o"])], "body",
                             [_vi("e", F, [None])], [_vi("o", F, [None])])
    nodes = [helper.make_node("Neg", ["x"], ["w"]),
             helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
             helper.make_node("SequenceMap", ["seq"], ["out"], body=body)]
    out_t = helper.make_tensor_sequence_value_info("out", F, [None])
    model = _model(nodes, [_vi("x", F, [3])], [out_t])
    (out,) = _run(model, {"x": np.ones(3, np.float32)})
    assert len(out) == 2
    for o in out:
        np.testing.assert_array_equal(o, np.zeros(3, np.float32))


def test_kernel_error_inside_a_subgraph_names_both_nodes():
    body = helper.make_graph(
        [helper.make_node("Reshape", ["v_in", "bad_shape"], ["v_out"], name="inner_reshape"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("v_in", F, None)],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("v_out", F, None)])
    shape = helper.make_node("Constant", [], ["bad_shape"],
                             value=helper.make_tensor("s", TensorProto.INT64, [1], [7]))
    nodes = [shape, _i64("M", 1), _bool("c", True),
             helper.make_node("Loop", ["M", "c", "x"], ["v"], body=body, name="outer_loop")]
    model = _model(nodes, [_vi("x", F, [2])], [_vi("v", F, None)])
    with pytest.raises(KernelError, match=r"'outer_loop' \(Loop\).*'inner_reshape' \(Reshape\)"):
        _run(model, {"x": np.ones(2, np.float32)})


# ---- model-local functions ----


def _functions_model():
    # custom::scale(X; alpha) = X * alpha; custom::neg_double(X) = -scale(X, alpha=2).
    # neg_double is declared first although it calls scale.
    const = helper.make_node("Constant", [], ["a"])
    const.attribute.append(helper.make_attribute_ref("value_float", onnx.AttributeProto.FLOAT))
    const.attribute[0].ref_attr_name = "alpha"  # the Constant reads the function attribute `alpha`
    scale = helper.make_function("custom", "scale", ["X"], ["Y"], [const, helper.make_node("Mul", ["X", "a"], ["Y"])],
                                 [helper.make_opsetid("", 17)], attributes=["alpha"])
    neg_double = helper.make_function(
        "custom", "neg_double", ["X"], ["Y"],
        [helper.make_node("scale", ["X"], ["t"], domain="custom", alpha=2.0), helper.make_node("Neg", ["t"], ["Y"])],
        [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    nodes = [helper.make_node("neg_double", ["x"], ["y"], domain="custom")]
    return _model(nodes, [_vi("x", F, [3])], [_vi("y", F, [3])], functions=[neg_double, scale],
                  extra_opsets=[("custom", 1)])


def test_model_local_functions_calling_each_other_in_any_order():
    model = _functions_model()
    x = np.array([1.0, -2.0, 0.5], np.float32)
    (y,) = got = _run(model, {"x": x})
    np.testing.assert_allclose(y, -2 * x)
    _check_against_ort(model, {"x": x}, got)


def test_model_local_function_wins_over_a_fast_kernel_of_the_same_name():
    # A local function named like a standard op in its own domain is still the function.
    fn = helper.make_function("custom", "Relu", ["X"], ["Y"], [helper.make_node("Neg", ["X"], ["Y"])],
                              [helper.make_opsetid("", 17)])
    model = _model([helper.make_node("Relu", ["x"], ["y"], domain="custom")], [_vi("x", F, [2])],
                   [_vi("y", F, [2])], functions=[fn], extra_opsets=[("custom", 1)])
    (y,) = _run(model, {"x": np.array([1.0, -1.0], np.float32)})
    np.testing.assert_array_equal(y, [-1.0, 1.0])


# ---- ops that need more than a plain op class ----


def _group_norm(x, scale, bias, groups, eps=1e-5):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return norm * scale.reshape(shape) + bias.reshape(shape)


def test_context_dependent_function_op_is_built_per_input_type():
    # GroupNormalization-21 has no reference class, only a function body that depends on input types.
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    call = bind_fallback(node, {"": 21}, {}, ())
    rng = np.random.default_rng(0)
    for dtype, rtol in ((np.float32, 1e-4), (np.float64, 1e-6)):  # stash_type=1: statistics in float32
        x = rng.standard_normal((2, 4, 3)).astype(dtype)
        s, b = rng.standard_normal(4).astype(dtype), rng.standard_normal(4).astype(dtype)
        (y,) = call(x, s, b)
        assert y.dtype == dtype
        np.testing.assert_allclose(y, _group_norm(x, s, b, 2), rtol=rtol, atol=rtol)
    assert len(call._calls) == 2  # one function body per (dtype, rank) signature


def test_ai_onnx_ml_op_runs_through_the_fallback():
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    model = _model([node], [_vi("x", F, [3])], [_vi("y", F, [3])], extra_opsets=[("ai.onnx.ml", 1)])
    (y,) = _run(model, {"x": np.array([0.2, 0.5, 0.9], np.float32)})
    np.testing.assert_array_equal(y, [0.0, 0.0, 1.0])


def test_fallback_is_named_and_counted():
    """SequenceMap (still on the reference) reading an outer value; If, Loop and Scan are native and
    not counted."""
    body = helper.make_graph([helper.make_node("Add", ["x_t", "w"], ["y_t"])], "body", [_vi("x_t", F, [2])],
                             [_vi("y_t", F, [2])])
    node = helper.make_node("SequenceMap", ["xs"], ["ys"], body=body)
    bound = bind_node(node, {"": 17})
    assert bound.is_fallback and bound.name == "fallback:ai.onnx::SequenceMap-17"
    assert bound.implicit_inputs == ("w",)
    before = FALLBACK_CALLS["ai.onnx::SequenceMap"]
    (ys,) = bound.call([np.zeros(2, np.float32), np.ones(2, np.float32)], np.full(2, 0.5, np.float32))
    np.testing.assert_array_equal(np.stack(ys), [[0.5, 0.5], [1.5, 1.5]])
    assert FALLBACK_CALLS["ai.onnx::SequenceMap"] == before + 1
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["r"])], "then", [], [_vi("r", F, [2])])
    native_if = bind_node(helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=then_g), {"": 17})
    assert not native_if.is_fallback and native_if.name == "control:ai.onnx::If-17"
    assert native_if.implicit_inputs == ("x",)
    before = dict(FALLBACK_CALLS)
    (y,) = native_if.call(np.array(True), np.ones(2, np.float32))
    np.testing.assert_array_equal(y, [1.0, 1.0])
    assert dict(FALLBACK_CALLS) == before  # nothing counted


def test_fallback_env_builds_model_functions_lazily():
    env = FallbackEnv({"": 17}, {})
    assert env._functions is None
    bind_fallback(helper.make_node("Abs", ["a"], ["b"]), {"": 17}, {}, (), env)
    assert env.functions == {}


@pytest.mark.parametrize("node,opsets,match", [
    (helper.make_node("NoSuchOp", ["x"], ["y"]), {"": 17}, "NoSuchOp"),
    (helper.make_node("Thing", ["x"], ["y"], domain="com.example"), {"": 17, "com.example": 1}, "com.example"),
])
def test_unknown_op_is_unsupported_at_bind_time(node, opsets, match):
    with pytest.raises(UnsupportedOpError, match=match):
        bind_node(node, opsets)


def test_broken_subgraph_is_a_load_error_naming_the_inner_node():
    body = helper.make_graph([helper.make_node("Neg", ["p"], ["q"], name="in_a"),
                              helper.make_node("Neg", ["q"], ["p"], name="in_b")],
                             "then", [], [_vi("q", F, [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
                   [_vi("c", TensorProto.BOOL, [])], [_vi("y", F, [2])])
    with pytest.raises(onnx_prepared.ModelLoadError, match="cycle"):
        onnx_prepared.InferenceSession(model)


def test_unsupported_op_inside_a_subgraph_names_it():
    body = helper.make_graph([helper.make_node("NoSuchOp", ["c"], ["q"])], "then", [], [_vi("q", F, [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
                   [_vi("c", TensorProto.BOOL, [])], [_vi("y", F, [2])])
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        onnx_prepared.InferenceSession(model)


def test_global_lp_pool_missing_from_the_reference_is_provided():
    model = _model([helper.make_node("GlobalLpPool", ["x"], ["y"], p=3)], [_vi("x", F, [2, 3, 4, 5])],
                   [_vi("y", F, [2, 3, 1, 1])])
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    (y,) = got = _run(model, {"x": x})
    np.testing.assert_allclose(y, (np.abs(x) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3), rtol=1e-5)
    _check_against_ort(model, {"x": x}, got)


def test_subgraph_factory_is_what_the_fallback_builds_bodies_with():
    """The fallback imports no planner: bodies come from the env's subgraph factory (graph_env's)."""
    from onnx_prepared.bind import SubgraphEvaluator, graph_env

    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["r"])], "then", [], [_vi("r", F, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=then_g)
    built = []

    def factory(graph, env):
        built.append(graph.name)
        return SubgraphEvaluator(graph, env)

    call = bind_fallback(node, {"": 17}, {}, ("x",), FallbackEnv({"": 17}, {}, subgraph=factory))
    (y,) = call(np.array(True), np.ones(2, np.float32))
    np.testing.assert_array_equal(y, [-1.0, -1.0])
    assert built == ["then", "then"]
    assert graph_env({"": 17})._subgraph is SubgraphEvaluator
