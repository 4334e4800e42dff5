"""LeakyRelu and Clip after a Conv, fused into the FusedConv epilogue (resolve/fusions.py
``_conv_epilogue``, act code 2 = LeakyRelu in sgemm.c, depthwise.c, im2col_direct.c): which graphs are
rewritten, the native LeakyRelu epilogue at every dispatch level bit for bit against the numpy epilogue of
the unfused kernel's output, and fused models against onnxruntime, first run and later runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import conv_prepacked as cp
from onnx_prepared.kernels import native
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path

RNG = np.random.default_rng(23)
needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _save(tmp_path, nodes, inits, xs, out, opset, name="m.onnx"):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    p = str(tmp_path / name)
    onnx.save(model, p)
    return p


def _conv_act(tmp_path, act_nodes, *, xs=(1, 8, 12, 12), m=16, k=3, group=1, strides=(1, 1), pads=1, opset=13,
              bn=False, name="m.onnx"):
    """x -> Conv(W, B) [-> BatchNormalization] -> ``act_nodes(conv_output)`` (a list of nodes ending in "y")."""
    c = xs[1]
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c // group, k, k)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[pads] * 4, group=group, strides=list(strides))]
    cur = "c"
    if bn:
        for nm, v in (("s", RNG.uniform(0.5, 2, m)), ("bb", RNG.standard_normal(m)), ("mu", RNG.standard_normal(m)),
                      ("var", RNG.uniform(0.1, 3, m))):
            inits.append(numpy_helper.from_array(v.astype(np.float32), nm))
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], epsilon=1e-5))
        cur = "n"
    nodes += act_nodes(cur)
    return _save(tmp_path, nodes, inits, xs, "y", opset, name), xs


def _leaky(alpha=0.1):
    return lambda x: [helper.make_node("LeakyRelu", [x], ["y"], alpha=alpha)]


def _scalar(name, v):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32), name))


def _relu6_constants(x):
    return [_scalar("lo", 0.0), _scalar("hi", 6.0), helper.make_node("Clip", [x, "lo", "hi"], ["y"])]


def _ops(p):
    return [n.op_type for n in resolve_model(load_model(p)).graph().node]


def _check(p, xs, x=None):
    import onnxruntime as ort

    x = RNG.standard_normal(xs).astype(np.float32) * 3 if x is None else x
    (expected,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with RuntimeSession(p) as s:
        for _ in range(2):  # cold, then prepared
            (got,) = s.run({"x": x})
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kw", [
    {},  # 3x3 unit stride: conv_direct
    {"strides": (2, 2)},  # im2col + packed SGEMM
    {"k": 1, "pads": 0},  # pointwise SGEMM
    {"m": 8, "group": 8, "xs": (1, 8, 12, 12)},  # depthwise
    {"xs": (3, 8, 4, 4)},  # a batch of small planes and small weights: per image
    {"xs": (3, 8, 4, 4), "merge_from": 0},  # ... merged whatever the weights: the merged SGEMM
    {"bn": True, "strides": (2, 2), "alpha": 0.2},  # Conv + BatchNormalization + LeakyRelu, as bn_cnn
])
def test_conv_leaky_relu_fuses_and_matches_onnxruntime(tmp_path, path, kw, monkeypatch):
    from onnx_prepared.kernels import conv_prepacked as cp

    kw = dict(kw)
    if "merge_from" in kw:
        monkeypatch.setattr(cp, "_MERGE_MIN_WEIGHTS", kw.pop("merge_from"))
    p, xs = _conv_act(tmp_path, _leaky(kw.pop("alpha", 0.1)), **kw)
    assert _ops(p) == ["FusedConv"]
    _check(p, xs)


@pytest.mark.parametrize(("opset", "acts"), [
    (13, _relu6_constants),
    (10, lambda x: [helper.make_node("Clip", [x], ["y"], min=-1.5, max=2.5)]),
    (10, lambda x: [helper.make_node("Clip", [x], ["y"], max=1.0)]),  # Clip-6's default min: no lower bound
    (13, lambda x: [_scalar("hi", 0.5), helper.make_node("Clip", [x, "", "hi"], ["y"])]),
])
def test_conv_clip_of_constant_bounds_fuses_and_matches_onnxruntime(tmp_path, path, opset, acts):
    p, xs = _conv_act(tmp_path, acts, opset=opset)
    ops = _ops(p)
    assert "FusedConv" in ops and "Clip" not in ops and "Conv" not in ops
    _check(p, xs)


def test_clip_of_initializer_or_inverted_bounds_is_not_fused(tmp_path):
    def init_bound(x):
        return [helper.make_node("Clip", [x, "lo0"], ["y"])]

    p, xs = _conv_act(tmp_path, init_bound)
    m = onnx.load(p)
    m.graph.initializer.append(numpy_helper.from_array(np.array(0.25, np.float32), "lo0"))
    onnx.save(m, p)
    assert _ops(p) == ["Conv", "Clip"]
    _check(p, xs)

    def inverted(x):  # min > max: every value becomes max, which no clip to [lo, hi] computes
        return [_scalar("lo", 2.0), _scalar("hi", 1.0), helper.make_node("Clip", [x, "lo", "hi"], ["y"])]

    p, xs = _conv_act(tmp_path, inverted, name="inv.onnx")
    assert "Clip" in _ops(p)
    _check(p, xs)


def _spec(ws, attrs):
    class Node:
        domain, op_type = "", "Conv"

    return cp.conv_rule(Node, dict(attrs), frozenset({1, 2}), {1: (ws, "float32"), 2: ((ws[0],), "float32")})


@needs_ext
@pytest.mark.parametrize(("xs", "ws", "attrs"), [
    ((1, 8, 16, 16), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # conv_direct
    ((1, 8, 16, 16), (4, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # im2col, column task (M <= 8)
    ((1, 8, 16, 16), (40, 8, 1, 1), {}),  # pointwise, row task (full panels)
    ((1, 24, 20, 20), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),  # depthwise planes
    ((1, 40, 5, 5), (40, 1, 3, 3), {"group": 40, "pads": [1, 1, 1, 1]}),  # depthwise, channels last
    ((3, 8, 4, 4), (24, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # merged batch
])
def test_native_leaky_epilogue_is_the_numpy_epilogue_of_the_plain_output(xs, ws, attrs):
    x = RNG.standard_normal(xs).astype(np.float32) * 3
    x.flat[::37] = np.nan
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    spec = _spec(ws, attrs)
    packed, k = spec.pack(w), spec.kernel
    leaky, plain = k.with_epilogue(act=native.ACT_LEAKY_RELU, alpha=0.3), k.with_epilogue()
    for level in native.supported_levels():
        with native.forced_level(level):
            for _ in range(2):  # the plan is made, then used
                (y,) = leaky(packed, x, b)
                (ref,) = plain(packed, x, b)
                np.testing.assert_array_equal(y, native.epilogue(ref.copy(), -np.inf, np.inf, 2, 0.3))
    assert leaky.native_plans() == 1


def test_unprepacked_epilogue_and_sgemm_fallback_apply_the_slope(path):
    a = RNG.standard_normal((1, 20, 30)).astype(np.float32)
    x = RNG.standard_normal((2, 1, 30, 21)).astype(np.float32) * 3
    bias = RNG.standard_normal(20).astype(np.float32)
    pre = np.matmul(a, x) + bias.reshape(1, 20, 1)
    ref = np.where(pre < 0, pre * np.float32(0.05), pre)
    y = native.sgemm_packed(native.pack_panels(a), 20, x, bias, -np.inf, np.inf, native.ACT_LEAKY_RELU, 0.05)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    from onnx_prepared.kernels.conv_fused import fused_conv

    xc = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    wc = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    from onnx_prepared.kernels.conv import conv

    (c,) = conv(xc, wc, pads=[1, 1, 1, 1])
    (got,) = fused_conv(xc, wc, pads=[1, 1, 1, 1], activation_act=2, activation_alpha=0.5)
    np.testing.assert_allclose(got, np.where(c < 0, c * 0.5, c), rtol=1e-6, atol=1e-6)


def test_native_entry_points_reject_an_unknown_activation():
    if not native.available():
        pytest.skip("native extension not built")
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="act is 0, 1 or 2"):
        native.depthwise2d(x, np.zeros((2, 1, 9), np.float32), None, (4, 4), (1, 1), (1, 1), (1, 1), (3, 3),
                           act=3)
    with pytest.raises(ValueError, match="act is 0, 1 or 2"):
        native.sgemm_packed(native.pack_panels(np.zeros((1, 2, 3), np.float32)), 2, np.zeros((1, 1, 3, 4),
                            np.float32), act=3)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 2), c=st.sampled_from([3, 8]), m=st.sampled_from([4, 16, 24]), hw=st.integers(3, 13),
       k=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2), alpha=st.sampled_from([0.01, 0.1, 0.5]))
def test_conv_leaky_relu_matches_onnxruntime_on_any_shape(tmp_path_factory, n, c, m, hw, k, stride, alpha):
    tmp = tmp_path_factory.mktemp("leaky")
    p, xs = _conv_act(tmp, _leaky(alpha), xs=(n, c, hw, hw), m=m, k=k, pads=k // 2, strides=(stride, stride))
    _check(p, xs)
