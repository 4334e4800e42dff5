"""Squeeze-excite blocks fused into one SqueezeExcite (resolve/fusions.py, kernels/squeeze_excite.py) and
initializer Identities forwarded: which graphs are rewritten, every path (numpy and each dispatch level)
against onnxruntime, first run and later runs, the native block bit-identical across levels, and the
transposed weights through the companion."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import native
from onnx_prepared.kernels import squeeze_excite as se
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path

RNG = np.random.default_rng(23)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _model(tmp_path, *, gate="HardSigmoid", swap=False, c=24, cr=8, xs=(2, 24, 5, 6), extra_use=False,
           identity_weight=False):
    """x -> SE block -> Mul (gate on the left with ``swap``); W1 read through an Identity with
    ``identity_weight``."""
    inits = [numpy_helper.from_array(RNG.standard_normal((cr, c, 1, 1)).astype(np.float32), "W1"),
             numpy_helper.from_array(RNG.standard_normal(cr).astype(np.float32), "B1"),
             numpy_helper.from_array(RNG.standard_normal((c, cr, 1, 1)).astype(np.float32) * 0.5, "W2"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "B2")]
    nodes = []
    w1 = "W1"
    if identity_weight:
        nodes.append(helper.make_node("Identity", ["W1"], ["W1i"]))
        w1 = "W1i"
    gate_attrs = {"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}
    nodes += [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
              helper.make_node("Conv", ["p", w1, "B1"], ["c1"], kernel_shape=[1, 1]),
              helper.make_node("Relu", ["c1"], ["r"]),
              helper.make_node("Conv", ["r", "W2", "B2"], ["c2"]),
              helper.make_node(gate, ["c2"], ["g"], **gate_attrs),
              helper.make_node("Mul", ["g", "x"] if swap else ["x", "g"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("Neg", ["r"], ["nr"]))
        outs.append(helper.make_tensor_value_info("nr", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))], outs,
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    p = str(tmp_path / "se.onnx")
    onnx.save(model, p)
    return p, xs


def _ops(p):
    return [n.op_type for n in resolve_model(load_model(p)).graph().node]


def _check(p, xs):
    import onnxruntime as ort

    x = RNG.standard_normal(xs).astype(np.float32)
    expected = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with RuntimeSession(p) as s:
        for _ in range(2):  # cold, then prepared
            for g, e in zip(s.run({"x": x}), expected):
                np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("gate", "swap"), [("HardSigmoid", False), ("HardSigmoid", True), ("Sigmoid", False)])
def test_se_block_fuses_and_matches_onnxruntime(tmp_path, path, gate, swap):
    p, xs = _model(tmp_path, gate=gate, swap=swap, identity_weight=True)
    assert _ops(p) == ["SqueezeExcite"]
    _check(p, xs)


def test_an_intermediate_read_twice_is_not_fused(tmp_path):
    p, xs = _model(tmp_path, extra_use=True)
    assert "SqueezeExcite" not in _ops(p)
    _check(p, xs)


def test_native_block_is_the_same_at_every_level_and_matches_numpy():
    c, cr = 40, 12
    x = RNG.standard_normal((2, c, 3, 3)).astype(np.float32)
    w1, w2 = RNG.standard_normal((cr, c, 1, 1)).astype(np.float32), RNG.standard_normal((c, cr, 1, 1)).astype(
        np.float32)
    b1, b2 = RNG.standard_normal(cr).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    packed = se._pack(w1, w2)
    outs = []
    for level in native.supported_levels():
        with native.forced_level(level):
            outs.append(se._packed_kernel(c, cr, 0, 1 / 6, 0.5, packed, x, b1, b2)[0])
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    s = x.astype(np.float64).mean(axis=(2, 3))
    g = np.maximum(s @ w1.reshape(cr, c).T + b1, 0) @ w2.reshape(c, cr).T + b2
    ref = x * np.clip(g / 6 + 0.5, 0, 1)[:, :, None, None]
    (unpacked,) = se.squeeze_excite(x, w1, b1, w2, b2, alpha=1 / 6, beta=0.5)
    for y in [*outs, unpacked]:
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_se_weights_round_trip_through_the_companion(tmp_path):
    p, xs = _model(tmp_path)
    x = RNG.standard_normal(xs).astype(np.float32)
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "c.onnx")}
    with RuntimeSession(p, opts) as s:
        assert [k for k in s.resolved.kernel_choices if k.startswith("prepacked:")] == [
            "prepacked:se-w-t-float32-c24-r8"]
        s.prepare()
        (y,) = s.run({"x": x})
    with RuntimeSession(p, {**opts, "prepared_model_policy": "read_only"}) as s:
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)
        (y2,) = s.run({"x": x})
        assert not any(k.startswith("prepack:") for k in s.state.counters)
    np.testing.assert_array_equal(y2, y)


@pytest.mark.skipif(not native.available(), reason="needs the extension")
@pytest.mark.parametrize(("n", "c", "cr", "hw"), [(2, 70, 40, (50, 42)), (1, 200, 72, (4, 4)), (3, 33, 7, (2, 2))])
def test_native_block_is_the_same_for_every_thread_count_and_level(n, c, cr, hw):
    """Blocks large enough for the pool (se_block.c's phases cut into items: means of a few channels each
    on 2100-position planes, hidden and excite items with vector tails, several images) give the same bits
    on 1, 2 and 3 threads and at every level, and match float64 numpy."""
    x = RNG.standard_normal((n, c, *hw)).astype(np.float32)
    w1, w2 = RNG.standard_normal((cr, c, 1, 1)).astype(np.float32), RNG.standard_normal((c, cr, 1, 1)).astype(
        np.float32) * 0.3
    b1, b2 = RNG.standard_normal(cr).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    packed = se._pack(w1, w2)
    before = native.get_num_threads()
    outs = []
    try:
        for level in native.supported_levels():
            with native.forced_level(level):
                for t in (1, 2, 3):
                    native.set_num_threads(t)
                    outs.append(se._packed_kernel(c, cr, 0, 1 / 6, 0.5, packed, x, b1, b2)[0])
    finally:
        native.set_num_threads(before)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    s = x.astype(np.float64).mean(axis=(2, 3))
    g = np.maximum(s @ w1.reshape(cr, c).T.astype(np.float64) + b1, 0) @ w2.reshape(c, cr).T + b2
    ref = x * np.clip(g / 6 + 0.5, 0, 1)[:, :, None, None]
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not native.available(), reason="needs the extension")
def test_packed_call_plans_per_shape_and_falls_back():
    """The prepacked call's plan (one extension call per later call of a shape) gives the bits of
    _packed_kernel; another bias object, a strided input or another shape re-plan or take the general path."""
    c, cr = 24, 8
    w1, w2 = RNG.standard_normal((cr, c, 1, 1)).astype(np.float32), RNG.standard_normal((c, cr, 1, 1)).astype(
        np.float32)
    b1, b2 = RNG.standard_normal(cr).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    packed = se._pack(w1, w2)
    k = se.PackedSqueezeExcite(c, cr, 0, 1 / 6, 0.5)
    x = RNG.standard_normal((2, c, 5, 6)).astype(np.float32)
    ref = se._packed_kernel(c, cr, 0, 1 / 6, 0.5, packed, x, b1, b2)[0]
    for _ in range(3):
        np.testing.assert_array_equal(k(packed, x, b1, b2)[0], ref)
    assert len(k._plans) == 1
    b2b = b2 * 2
    np.testing.assert_array_equal(k(packed, x, b1, b2b)[0], se._packed_kernel(c, cr, 0, 1 / 6, 0.5, packed, x, b1,
                                                                                b2b)[0])
    xs = RNG.standard_normal((2, c, 5, 12)).astype(np.float32)[..., ::2]
    np.testing.assert_array_equal(k(packed, xs, b1, b2b)[0], se._packed_kernel(c, cr, 0, 1 / 6, 0.5, packed, xs,
                                                                                 b1, b2b)[0])
    np.testing.assert_array_equal(k(packed, x[:1], None, None)[0],
                                  se._packed_kernel(c, cr, 0, 1 / 6, 0.5, packed, x[:1], None, None)[0])
    assert len(k._plans) == 2
    sig = se.PackedSqueezeExcite(c, cr, se.GATE_SIGMOID, 0.2, 0.5)
    np.testing.assert_array_equal(sig(packed, x, b1, b2)[0], se._packed_kernel(c, cr, 1, 0.2, 0.5, packed, x, b1,
                                                                                 b2)[0])
    assert not sig._plans
