"""The Llama MLP's SiLU, Mul(x, Sigmoid(x)) and its gate Mul, fused into onnx_prepared::SiLU
(resolve/fusions_silu.py, kernels/silu.py, _native/silu.c): the same bits as the unfused graph at every
dispatch level and thread count, onnxruntime's values, and the chains it must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared
from onnx_prepared import onnx_proto
from onnx_prepared.kernels import native
from onnx_prepared.kernels.silu import silu
from onnx_prepared.resolve import resolver
from onnx_prepared.resolve.fusions_silu import fuse_silu

ort = pytest.importorskip("onnxruntime")
LEVELS = [*native.supported_levels(), "numpy"]
H = 2816 // 8 + 5  # a masked tail at every vector width


def _mlp_model(*, swap=False, gate=True, gate_first=True, dtype=TensorProto.FLOAT, silu_out=False) -> bytes:
    """z [B, S, 2H] -> gate = z[..., :H], up = z[..., H:] -> Sigmoid(gate) -> Mul(gate, s) -> Mul(., up) -> y,
    as the genai builder writes it (``swap``: Mul(s, gate); ``gate_first``: Mul(silu, up) vs Mul(up, silu);
    ``silu_out``: the SiLU is a graph output too)."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("s0", [0]), ("s1", [H]), ("e1", [2 * H]), ("ax", [-1]))]
    nodes = [helper.make_node("Slice", ["z", "s0", "s1", "ax"], ["g"]),
             helper.make_node("Slice", ["z", "s1", "e1", "ax"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["s", "g"] if swap else ["g", "s"], ["t"])]
    outs = [helper.make_tensor_value_info("y" if gate else "t", dtype, None)]
    if gate:
        nodes.append(helper.make_node("Mul", ["t", "u"] if gate_first else ["u", "t"], ["y"]))
    if silu_out and gate:
        outs.append(helper.make_tensor_value_info("t", dtype, None))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("z", dtype, ["B", "S", 2 * H])], outs,
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _z(shape=(1, 37, 2 * H), dtype=np.float32) -> np.ndarray:
    z = (np.random.default_rng(sum(shape)).standard_normal(shape) * 6).astype(dtype)
    if z.size >= 10:
        z.reshape(-1)[:10] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 30, -30, 1e-30, -1e-30, 18]
    return z


def _kernels(sess) -> list[str]:
    return [k.name for k in sess._rt.resolved.kernels]


def _run(sess, feeds, level):
    if level == "numpy":
        saved, native._ext = native._ext, None
        try:
            return sess.run(None, feeds)
        finally:
            native._ext = saved
    with native.forced_level(level):
        return sess.run(None, feeds)


def _unfused(model: bytes, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(resolver, "fuse_silu", lambda *a, **k: 0)
        sess = onnx_prepared.InferenceSession(model)
    assert not any("SiLU" in k for k in _kernels(sess))
    return sess


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("variant", [{}, {"swap": True}, {"gate_first": False}, {"gate": False}])
def test_fused_silu_keeps_the_unfused_bits_and_matches_onnxruntime(level, variant, monkeypatch):
    model = _mlp_model(**variant)
    sess = onnx_prepared.InferenceSession(model)
    ks = _kernels(sess)
    assert sum("SiLU" in k for k in ks) == 1 and not any("Sigmoid" in k or "Mul" in k for k in ks), ks
    ref = _unfused(model, monkeypatch)
    for shape in [(1, 37, 2 * H), (2, 1, 2 * H), (1, 0, 2 * H)]:
        feeds = {"z": _z(shape)}
        (got,) = _run(sess, feeds, level)
        (want,) = _run(ref, feeds, level)
        assert got.dtype == np.float32 and got.shape == (*shape[:2], H)
        np.testing.assert_array_equal(got, want)  # bit for bit (NaN where NaN)
        (o,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        if level != "numpy" and "avx2" in native.supported_levels():
            np.testing.assert_array_equal(got, o)  # MLAS's FMA3 logistic, then the products
        np.testing.assert_allclose(got, o, rtol=1e-3, atol=1e-4)


def test_half_precision_runs_the_unfused_kernels(monkeypatch):
    model = _mlp_model(dtype=TensorProto.FLOAT16)
    sess = onnx_prepared.InferenceSession(model)
    assert any("SiLU" in k for k in _kernels(sess))
    feeds = {"z": np.clip(_z(dtype=np.float32), -60000, 60000).astype(np.float16)}
    (got,) = sess.run(None, feeds)
    (want,) = _unfused(model, monkeypatch).run(None, feeds)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


def test_chains_it_must_not_fuse():
    """A Sigmoid read twice, a Mul of another tensor, a graph-output Sigmoid: left as written; a SiLU the
    graph returns keeps its own output (the gate Mul stays a Mul)."""
    g = onnx_proto.GraphProto()
    g.node.add(op_type="Sigmoid", input=["x"], output=["s"])
    g.node.add(op_type="Mul", input=["x", "s"], output=["t"])
    g.node.add(op_type="Relu", input=["s"], output=["r"])
    g.node.add(op_type="Sigmoid", input=["a"], output=["s2"])
    g.node.add(op_type="Mul", input=["b", "s2"], output=["t2"])
    g.node.add(op_type="Sigmoid", input=["c"], output=["s3"])
    g.node.add(op_type="Mul", input=["c", "s3"], output=["t3"])
    g.output.add(name="s3")
    assert fuse_silu(g, {}) == 0 and len(g.node) == 7
    sess = onnx_prepared.InferenceSession(_mlp_model(silu_out=True))
    ks = _kernels(sess)
    assert sum("SiLU" in k for k in ks) == 1 and sum("Mul" in k for k in ks) == 1, ks


def _views(rng, rows=33, h=H):
    z = (rng.standard_normal((2, rows, 2 * h)) * 5).astype(np.float32)
    return z[..., :h], z[..., h:]


def test_kernel_reads_strided_views_and_falls_back_on_broadcast():
    rng = np.random.default_rng(3)
    x, u = _views(rng)
    want = np.multiply(np.multiply(x, _sig(x)), u)
    (y,) = silu(x, u)
    np.testing.assert_array_equal(y, want)
    (y,) = silu(np.ascontiguousarray(x), np.ascontiguousarray(u))
    np.testing.assert_array_equal(y, want)
    (y,) = silu(x[:, ::2], u[:, ::2])  # leading axes that are no longer rows of one stride
    np.testing.assert_array_equal(y, want[:, ::2])
    (y,) = silu(x[..., ::-1], u[..., ::-1])  # reversed last axis
    np.testing.assert_array_equal(y, want[..., ::-1])
    b = u[:1, :1]  # broadcast gate
    (y,) = silu(x, b)
    np.testing.assert_array_equal(y, np.multiply(np.multiply(x, _sig(x)), b))
    s = np.float32(1.5)
    (y,) = silu(np.asarray(s))
    assert y.shape == () and y == np.multiply(s, _sig(np.asarray(s)))


def _sig(x):
    from onnx_prepared.kernels.activation import sigmoid

    return sigmoid(x)[0]


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_thread_count_does_not_change_a_bit():
    x, u = _views(np.random.default_rng(5), rows=128)
    before = native.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            native.set_num_threads(n)
            outs.append(silu(x, u)[0])
    finally:
        native.set_num_threads(before)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_native_entry_refuses_bad_buffers():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(TypeError, match="float32"):
        native._ext.silu(x.astype(np.float64), None, np.empty((4, 8), np.float32))
    with pytest.raises(ValueError, match="one shape"):
        native._ext.silu(x, np.zeros((4, 7), np.float32), np.empty((4, 8), np.float32))
    with pytest.raises(ValueError, match="x's size"):
        native._ext.silu(x, None, np.empty((4, 7), np.float32))
