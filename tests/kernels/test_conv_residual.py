"""Conv + residual Add (+ Relu / Clip) fused into one FusedConv reading the residual at input 7
(resolve/fusions.py's fuse_conv_add, kernels/conv_prepacked.py's ResidualConv): which graphs are
rewritten, every plan's residual epilogue bit for bit against the unfused Conv, Add and Relu, and fused
models against onnxruntime at every dispatch level, first run and later runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import conv_prepacked as cp
from onnx_prepared.kernels import native
from onnx_prepared.kernels.conv_fused import fused_conv
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path

RNG = np.random.default_rng(23)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _block(tmp_path, *, xs=(2, 16, 10, 10), m=16, act="Relu", downsample=False, swap=False, res_shape=None,
           bn=False, extra_use=False):
    """A ResNet block: Conv(x) + R, then ``act`` (None: the Add's output is the graph's). R is x itself, a
    1x1 stride-1 downsample Conv of x listed after the Add's Conv (``downsample``), or a graph input of
    ``res_shape`` (a broadcast residual)."""
    c = xs[1]
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1])]
    if bn:
        stats = {"s": RNG.uniform(0.5, 2, m), "bb": RNG.standard_normal(m), "mu": RNG.standard_normal(m),
                 "var": RNG.uniform(0.1, 3, m)}
        inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in stats.items()]
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["cn"]))
    conv_out = "cn" if bn else "c"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))]
    res = "x"
    if downsample:
        inits.append(numpy_helper.from_array(RNG.standard_normal((m, c, 1, 1)).astype(np.float32), "Wd"))
        nodes.append(helper.make_node("Conv", ["x", "Wd"], ["d"]))
        res = "d"
    if res_shape is not None:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(res_shape)))
        res = "r"
    nodes.append(helper.make_node("Add", [res, conv_out] if swap else [conv_out, res], ["s0"]))
    out = "s0"
    if act == "Clip":
        nodes.append(helper.make_node("Clip", ["s0"], ["a"], min=-0.5, max=1.5))
        out = "a"
    elif act:
        nodes.append(helper.make_node(act, ["s0"], ["a"]))
        out = "a"
    outs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
    if extra_use:
        outs.append(helper.make_tensor_value_info("s0", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10 if act == "Clip" else 14)])
    model.ir_version = 7
    p = str(tmp_path / "block.onnx")
    onnx.save(model, p)
    return p, {"x": xs, **({"r": res_shape} if res_shape is not None else {})}


def _check(p, shapes):
    import onnxruntime as ort

    feeds = {k: RNG.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    expected = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feeds)
    with RuntimeSession(p) as s:
        first = None
        for _ in range(3):  # cold, then prepared
            got = s.run(feeds)
            for g, e in zip(got, expected):
                np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)
            if first is None:
                first = got
            elif s.plan is not None:
                for g, f in zip(got, first):
                    np.testing.assert_array_equal(g, f)


def _ops(p):
    return [(n.op_type, len(n.input)) for n in resolve_model(load_model(p)).graph().node]


@pytest.mark.parametrize(("kw", "ops"), [
    ({}, [("FusedConv", 8)]),
    ({"swap": True, "act": None}, [("FusedConv", 8)]),
    ({"act": "Clip"}, [("FusedConv", 8)]),
    ({"act": "Sigmoid"}, [("FusedConv", 8), ("Sigmoid", 1)]),
    ({"downsample": True}, [("Conv", 2), ("FusedConv", 8)]),  # the 1x1 Conv's Add is read by the other Conv
    ({"bn": True}, [("FusedConv", 8)]),
    ({"extra_use": True}, [("FusedConv", 8), ("Relu", 1)]),  # the Add's output is returned: its Relu stays
])
def test_residual_blocks_fuse_and_match_onnxruntime(tmp_path, path, kw, ops):
    p, shapes = _block(tmp_path, **kw)
    assert _ops(p) == ops
    _check(p, shapes)


@pytest.mark.parametrize("res_shape", [(1, 16, 1, 1), (2, 16, 10, 10)])
def test_a_broadcast_or_input_residual_matches_onnxruntime(tmp_path, path, res_shape):
    p, shapes = _block(tmp_path, res_shape=res_shape)
    assert _ops(p) == [("FusedConv", 8)]
    _check(p, shapes)


def _spec(ws, attrs):
    class Node:
        domain, op_type = "", "Conv"

    return cp.conv_rule(Node, attrs, frozenset({1, 2}), {1: (ws, "float32"), 2: ((ws[0],), "float32")})


@pytest.mark.skipif(native._ext is None, reason="native extension not built")
@pytest.mark.parametrize(("xs", "ws", "attrs", "plan"), [
    ((2, 16, 16, 16), (48, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "implicit_residual"),
    ((2, 8, 17, 17), (32, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "implicit_residual"),
    ((2, 64, 4, 4), (256, 64, 3, 3), {"pads": [1, 1, 1, 1]}, "merged_residual"),
    ((1, 24, 4, 4), (40, 24, 1, 1), {}, "residual"),
    ((1, 16, 3, 3), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "residual"),  # rows below _IMPLICIT_MIN_WIDTH
    ((1, 16, 5, 5), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "implicit_residual"),
])
def test_every_plan_adds_the_residual_as_the_unfused_add_does(xs, ws, attrs, plan, monkeypatch):
    """The fused epilogue is (conv + bias) + r, then the clip: bit for bit the plain Conv, then Add, then
    Relu (or the Clip), at every level (below AVX-512 the implicit plan falls back to im2col)."""
    monkeypatch.setattr(cp, "_MERGE_MIN_WEIGHTS", 1 << 14)
    spec = _spec(ws, attrs)
    x, w, b = (RNG.standard_normal(s).astype(np.float32) for s in (xs, ws, ws[:1]))
    packed = spec.pack(w)
    for level in native.supported_levels():
        with native.forced_level(level):
            (y0,) = spec.kernel.with_epilogue()(packed, x, b)
            r = RNG.standard_normal(y0.shape).astype(np.float32)
            for lo, hi in ((0.0, np.inf), (-0.25, 0.5), (-np.inf, np.inf)):
                k = spec.kernel.with_epilogue(lo, hi, residual=True)
                (y,) = k(packed, x, b, None, None, None, None, r)
                assert k._plans[x.shape][1].__name__ == plan or level != "avx512vnni"
                ref = y0 + r
                if lo != -np.inf:
                    ref = np.maximum(ref, np.float32(lo))
                if hi != np.inf:
                    ref = np.minimum(ref, np.float32(hi))
                np.testing.assert_array_equal(y, ref)


def test_a_residual_epilogue_is_a_clip():
    with pytest.raises(ValueError, match="clip"):
        _spec((8, 4, 3, 3), {}).kernel.with_epilogue(act=native.ACT_HARDSWISH, residual=True)


def test_unprepacked_fused_conv_adds_the_residual_before_the_clip():
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    r = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    from onnx_prepared.kernels.conv import conv

    (ref,) = conv(x, w, pads=[1, 1, 1, 1])
    (y,) = fused_conv(x, w, None, None, None, None, None, r, pads=[1, 1, 1, 1], activation_lo=0.0)
    np.testing.assert_array_equal(y, np.maximum(ref + r, 0))
