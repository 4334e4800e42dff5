"""Conv + Relu / HardSwish fused into one FusedConv (resolve/fusions.py, kernels/conv_fused.py): which
graphs are rewritten, the native epilogues (sgemm, depthwise) at every dispatch level against numpy,
and fused models against onnxruntime, first run and later runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import native
from onnx_prepared.kernels.conv_fused import fused_conv
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path

RNG = np.random.default_rng(17)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _hardswish(y):
    return y * np.clip(y / 6 + 0.5, 0, 1)


def _model(tmp_path, acts, *, ws=(24, 8, 3, 3), xs=(2, 8, 9, 9), group=1, extra_use=False, conv_out=False):
    """x -> Conv(W, B) -> each of ``acts`` in turn (every Conv followed by its activation)."""
    nodes, inits, cur = [], [], "x"
    c = xs[1]
    for i, act in enumerate(acts):
        w = RNG.standard_normal((ws[0], c // group, *ws[2:])).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(
            RNG.standard_normal(ws[0]).astype(np.float32), f"B{i}")]
        nodes.append(helper.make_node("Conv", [cur, f"W{i}", f"B{i}"], [f"c{i}"], pads=[1, 1, 1, 1], group=group))
        nodes.append(helper.make_node(act, [f"c{i}"], [f"a{i}"]))
        cur, c = f"a{i}", ws[0]
    outs = [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)]
    if extra_use:  # the first conv's output read twice
        nodes.append(helper.make_node("Neg", ["c0"], ["n0"]))
        outs.append(helper.make_tensor_value_info("n0", TensorProto.FLOAT, None))
    if conv_out:
        outs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))], outs,
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    p = str(tmp_path / "m.onnx")
    onnx.save(model, p)
    return p, xs


def _check(p, xs):
    import onnxruntime as ort

    x = RNG.standard_normal(xs).astype(np.float32)
    expected = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with RuntimeSession(p) as s:
        for _ in range(2):  # cold, then prepared
            got = s.run({"x": x})
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)


def test_relu_and_hardswish_fuse_and_match_onnxruntime(tmp_path, path):
    p, xs = _model(tmp_path, ["Relu", "HardSwish", "Sigmoid"])
    g = resolve_model(load_model(p)).graph()
    ops = [n.op_type for n in g.node]
    assert ops == ["FusedConv", "FusedConv", "Conv", "Sigmoid"]
    _check(p, xs)


@pytest.mark.parametrize("act", ["Relu", "HardSwish"])
def test_depthwise_fused_matches_onnxruntime(tmp_path, path, act):
    p, xs = _model(tmp_path, [act, act], ws=(16, 1, 3, 3), xs=(1, 16, 12, 11), group=16)
    assert [n.op_type for n in resolve_model(load_model(p)).graph().node] == ["FusedConv"] * 2
    _check(p, xs)


def test_a_conv_read_twice_or_returned_is_not_fused(tmp_path):
    for kw in ({"extra_use": True}, {"conv_out": True}):
        p, xs = _model(tmp_path, ["Relu"], **kw)
        assert [n.op_type for n in resolve_model(load_model(p)).graph().node][:2] == ["Conv", "Relu"]
        _check(p, xs)


def test_unprepacked_fused_conv_is_conv_then_activation():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    from onnx_prepared.kernels.conv import conv

    (ref,) = conv(x, w, pads=[1, 1, 1, 1])
    (y,) = fused_conv(x, w, pads=[1, 1, 1, 1], activation_act=1)
    np.testing.assert_allclose(y, _hardswish(ref), rtol=1e-6, atol=1e-6)
    (y,) = fused_conv(x, w, pads=[1, 1, 1, 1], activation_lo=0.0, activation_hi=6.0)
    np.testing.assert_allclose(y, np.clip(ref, 0, 6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("lo", "hi", "act"), [(0.0, np.inf, 0), (-np.inf, np.inf, 1), (-1.0, 2.0, 1)])
def test_native_epilogues_match_numpy(path, lo, hi, act):
    a = RNG.standard_normal((1, 40, 30)).astype(np.float32)
    x = RNG.standard_normal((2, 1, 30, 21)).astype(np.float32) * 3
    bias = RNG.standard_normal(40).astype(np.float32)
    ref = native.epilogue(np.matmul(a, x) + bias.reshape(1, 40, 1), lo, hi, act)
    y = native.sgemm_packed(native.pack_panels(a), 40, x, bias, lo, hi, act)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    if path == "numpy":
        return
    xd = RNG.standard_normal((1, 6, 9, 19)).astype(np.float32) * 3
    wd = RNG.standard_normal((6, 1, 9)).astype(np.float32)
    args = (xd, wd, bias[:6], (9, 19), (1, 1), (1, 1), (1, 1), (3, 3))
    plain = native.depthwise2d(*args)
    np.testing.assert_allclose(native.depthwise2d(*args, lo, hi, act), native.epilogue(plain, lo, hi, act),
                               rtol=1e-5, atol=1e-5)


def test_fused_conv_weights_round_trip_through_the_companion(tmp_path):
    p, xs = _model(tmp_path, ["Relu", "HardSwish"])
    x = RNG.standard_normal(xs).astype(np.float32)
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "c.onnx")}
    with RuntimeSession(p, opts) as s:
        assert [k for k in s.resolved.kernel_choices if k.startswith("prepacked:")] == [
            "prepacked:conv-w-p16-float32-as-float32-g1-m24-ck72-k3x3",
            "prepacked:conv-w-p16-float32-as-float32-g1-m24-ck216-k3x3"]
        s.prepare()
        (y,) = s.run({"x": x})
        assert sum(1 for k in s.state.counters if k.startswith("prepack:")) == 2
    with RuntimeSession(p, {**opts, "prepared_model_policy": "read_only"}) as s:
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)
        (y2,) = s.run({"x": x})
        assert not any(k.startswith("prepack:") for k in s.state.counters)
    np.testing.assert_array_equal(y2, y)


def _bn_model(tmp_path, *, act="Relu", bias=True, group=1, opset=14, bn_attrs=None, stats_input=False,
              xs=(2, 8, 9, 9), m=16):
    """x -> Conv(W[, B]) -> BatchNormalization(constant statistics, or a graph input ``var``) -> act."""
    c = xs[1]
    w = RNG.standard_normal((m, c // group, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    conv_in = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B"))
        conv_in.append("B")
    stats = {"s": RNG.uniform(0.5, 2, m), "bb": RNG.standard_normal(m), "mu": RNG.standard_normal(m),
             "var": RNG.uniform(0.1, 3, m)}
    inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()
              if not (stats_input and k == "var")]
    nodes = [helper.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], **(bn_attrs or {}))]
    out = "n"
    if act:
        nodes.append(helper.make_node(act, ["n"], ["a"]))
        out = "a"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))]
    if stats_input:
        inputs.append(helper.make_tensor_value_info("var", TensorProto.FLOAT, [m]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    p = str(tmp_path / "bn.onnx")
    onnx.save(model, p)
    return p, xs, stats


@pytest.mark.parametrize(("act", "bias", "group", "opset"), [
    ("Relu", True, 1, 14), (None, False, 1, 9), ("HardSwish", False, 8, 15), ("Relu", True, 8, 11)])
def test_conv_batchnorm_folds_and_matches_onnxruntime(tmp_path, path, act, bias, group, opset):
    p, xs, _ = _bn_model(tmp_path, act=act, bias=bias, group=group, opset=opset, bn_attrs={"epsilon": 1e-3},
                         xs=(2, 8, 9, 9), m=16 if group == 1 else 8)
    assert [n.op_type for n in resolve_model(load_model(p)).graph().node] == ["FusedConv"]
    _check(p, xs)


def test_batchnorm_with_a_computed_statistic_or_training_mode_is_not_folded(tmp_path):
    p, _, _ = _bn_model(tmp_path, stats_input=True)
    assert [n.op_type for n in resolve_model(load_model(p)).graph().node] == ["Conv", "BatchNormalization",
                                                                             "Relu"]
    p, _, _ = _bn_model(tmp_path, act=None, opset=15, bn_attrs={"training_mode": 1})
    assert [n.op_type for n in resolve_model(load_model(p)).graph().node] == ["Conv", "BatchNormalization"]


def test_unprepacked_fused_conv_folds_batchnorm_per_call():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    s, bb, mu, var = (RNG.uniform(0.5, 2, 8).astype(np.float32) for _ in range(4))
    from onnx_prepared.kernels.channel_norm import batch_normalization
    from onnx_prepared.kernels.conv import conv

    (ref,) = batch_normalization(conv(x, w, pads=[1, 1, 1, 1])[0], s, bb, mu, var, epsilon=1e-3)
    (y,) = fused_conv(x, w, None, s, bb, mu, var, bn_epsilon=1e-3, pads=[1, 1, 1, 1])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_folded_weights_round_trip_through_the_companion(tmp_path):
    p, xs, _ = _bn_model(tmp_path, bias=False)
    x = RNG.standard_normal(xs).astype(np.float32)
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "c.onnx")}
    with RuntimeSession(p, opts) as s:
        assert [k for k in s.resolved.kernel_choices if k.startswith("prepacked:")] == [
            "prepacked:conv-w-p16-float32-as-float32-g1-m16-ck72-k3x3-bnfold-eps9.999999747378752e-06-b0"]
        s.prepare()
        (y,) = s.run({"x": x})
    with RuntimeSession(p, {**opts, "prepared_model_policy": "read_only"}) as s:
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)
        (y2,) = s.run({"x": x})
        assert not any(k.startswith("prepack:") for k in s.state.counters)
    np.testing.assert_array_equal(y2, y)
