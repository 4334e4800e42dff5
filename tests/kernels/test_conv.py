"""Conv fast kernels (general im2col, pointwise, depthwise) and the Conv weight prepack, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared import InferenceSession
from onnx_prepared.bind import bind_node
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from onnx_prepared.runtime import RuntimeSession
from tests.kernels.onnx_node_check import check, check_ort

RNG = np.random.default_rng(0)


def _r(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize(
    ("xs", "ws", "attrs"),
    [
        ((1, 3, 10, 11), (4, 3, 3, 3), {}),
        ((2, 4, 9, 9), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
        ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
        ((1, 6, 8, 8), (12, 1, 3, 3), {"group": 6, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),  # multiplier 2
        ((2, 5, 9, 7), (5, 1, 5, 5), {"group": 5, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ((1, 8, 7, 7), (5, 8, 1, 1), {}),  # pointwise
        ((2, 8, 7, 7), (6, 4, 1, 1), {"group": 2}),  # grouped pointwise
        ((1, 8, 7, 7), (5, 8, 1, 1), {"strides": [2, 2]}),  # strided 1x1: im2col
        ((1, 1, 9, 9), (4, 1, 3, 3), {"pads": [1, 2, 0, 1]}),  # one input channel (depthwise path, multiplier 4)
        ((1, 3, 9), (2, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [3]}),  # 1-D
        ((2, 4, 12), (4, 2, 3), {"group": 2, "dilations": [3], "pads": [2, 1]}),
        ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "dilations": [2, 1, 1]}),  # 3-D
        ((1, 4, 5, 6, 7), (4, 1, 3, 3, 3), {"group": 4, "auto_pad": "VALID"}),  # 3-D depthwise
        ((1, 3, 7, 7), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 3], "kernel_shape": [3, 3]}),
        ((1, 3, 224, 224), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # ResNet stem shape
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_against_onnxruntime(xs, ws, attrs, bias):
    inputs = [_r(*xs), _r(*ws)] + ([_r(ws[0])] if bias else [])
    check_ort("Conv", inputs, opset=11, **attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("group", [1, 3])
def test_conv_dtypes(dtype, group):
    """float16 against onnxruntime; float64 (which onnxruntime's CPU Conv lacks) against onnx.reference."""
    x, w, b = _r(1, 3, 8, 8, dtype=dtype), _r(6, 3 // group, 3, 3, dtype=dtype), _r(6, dtype=dtype)
    if dtype == np.float16:
        (y,) = check_ort("Conv", [x, w, b], opset=11, rtol=2e-2, atol=2e-2, group=group, pads=[1, 1, 1, 1])
    else:
        (y,) = check("Conv", [x, w, b], opset=11, rtol=1e-10, atol=1e-10, group=group, pads=[1, 1, 1, 1])
    assert y.dtype == dtype


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    nd=st.integers(1, 3), n=st.integers(1, 2), cg=st.integers(1, 3), g=st.integers(1, 3), mg=st.integers(1, 3),
    k=st.integers(1, 3), s=st.integers(1, 3), d=st.integers(1, 2), p=st.integers(0, 2),
    auto_pad=st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]), bias=st.booleans(),
    extra=st.integers(0, 4),
)
def test_conv_hypothesis(nd, n, cg, g, mg, k, s, d, p, auto_pad, bias, extra):
    if auto_pad.startswith("SAME"):
        d = 1  # onnxruntime rejects dilated SAME convs
    size = d * (k - 1) + 1 + extra
    x, w = _r(n, cg * g, *([size] * nd)), _r(mg * g, cg, *([k] * nd))
    attrs = {"group": g, "strides": [s] * nd, "dilations": [d] * nd, "auto_pad": auto_pad}
    if auto_pad == "NOTSET":
        attrs["pads"] = [p] * nd + [max(0, p - 1)] * nd
    check_ort("Conv", [x, w] + ([_r(mg * g)] if bias else []), opset=11, **attrs)


def test_conv_unknown_attribute_falls_back():
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], made_up=1)
    assert bind_node(node, {"": 13}).is_fallback


def _cnn(path, dtype=TensorProto.FLOAT):
    """Conv (W initializer) -> BatchNormalization -> Relu -> depthwise Conv -> MaxPool -> GlobalAveragePool."""
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [
        numpy_helper.from_array(_r(8, 3, 3, 3).astype(np_t), "W0"), numpy_helper.from_array(_r(8).astype(np_t), "B0"),
        numpy_helper.from_array(_r(8, 1, 3, 3).astype(np_t), "W1"),
    ]
    for name in ("s", "b", "m"):
        inits.append(numpy_helper.from_array(_r(8).astype(np_t), name))
    inits.append(numpy_helper.from_array((np.abs(_r(8)) + 0.5).astype(np_t), "v"))
    nodes = [
        helper.make_node("Conv", ["x", "W0", "B0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c0", "s", "b", "m", "v"], ["bn"], epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Conv", ["r", "W1"], ["c1"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", dtype, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def test_conv_weights_are_prepacked_and_restored_from_the_companion(tmp_path):
    path = _cnn(tmp_path / "cnn.onnx")
    resolved = resolve_model(load_model(path))
    layouts = [c for c in resolved.kernel_choices if c.startswith("prepacked:")]
    assert layouts == ["prepacked:conv-w-p16-float32-as-float32-g1-m8-ck27-k3x3-bnfold-eps0.0010000000474974513-b1",
                       "prepacked:conv-w-gmk-float32-as-float32-g8-m1-ck9-k3x3"]
    assert not any(c.startswith("fallback:") for c in resolved.kernel_choices)
    import onnxruntime as ort

    x = _r(1, 3, 16, 16)
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "c.onnx")}
    with RuntimeSession(path, opts) as s:
        s.prepare()
        (y,) = s.run({"x": x})
        assert sum(1 for k in s.state.counters if k.startswith("prepack:")) == 2
    np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-4)
    with RuntimeSession(path, {**opts, "prepared_model_policy": "read_only"}) as s:
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)
        (y2,) = s.run({"x": x})
        assert not any(k.startswith("prepack:") for k in s.state.counters)
    np.testing.assert_array_equal(y2, y)


def test_float16_conv_weights_pack_as_float32(tmp_path):
    path = _cnn(tmp_path / "cnn16.onnx", TensorProto.FLOAT16)
    resolved = resolve_model(load_model(path))
    assert "prepacked:conv-w-p16-float16-as-float32-g1-m8-ck27-k3x3" in resolved.kernel_choices
    import onnxruntime as ort

    x = _r(1, 3, 16, 16, dtype=np.float16)
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (y,) = InferenceSession(path).run(None, {"x": x})
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), expected.astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("xs", "ws", "attrs"),
    [
        ((1, 48, 9, 10), (48, 1, 3, 3), {"group": 48, "pads": [1, 1, 1, 1]}),
        ((2, 40, 11, 9), (80, 1, 5, 3), {"group": 40, "strides": [2, 1], "pads": [2, 0, 1, 2], "dilations": [1, 2]}),
        ((1, 64, 2, 2), (64, 1, 5, 5), {"group": 64, "pads": [2, 2, 2, 2]}),
        ((1, 32, 8, 8), (32, 1, 3, 3), {"group": 32, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ],
)
def test_depthwise_channels_last_path(xs, ws, attrs):
    """From 32 channels on, 2-D depthwise convs run channels-last (conv._depthwise_nhwc)."""
    check_ort("Conv", [_r(*xs), _r(*ws), _r(ws[0])], opset=11, **attrs)


def _same_at_every_level_and_near_numpy(x, w, b, kw):
    """fused_conv gives the same bits at every dispatch level, and the numpy path's values within rounding."""
    from onnx_prepared.kernels import native
    from onnx_prepared.kernels.conv_fused import fused_conv

    outs = []
    for level in native.supported_levels():
        with native.forced_level(level):
            outs.append(fused_conv(x, w, b, **kw)[0])
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    saved = native._ext
    try:
        native._ext = None
        (ref,) = fused_conv(x, w, b, **kw)
    finally:
        native._ext = saved
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("c", "hw", "k", "s", "pads"), [(70, 2, 5, 1, 2), (130, 4, 3, 2, 1), (24, 8, 5, 2, 2),
                                                     (9, 5, 3, 1, 0)])
def test_small_plane_depthwise_is_the_same_at_every_level_and_matches_numpy(c, hw, k, s, pads):
    """Input planes of at most 64 elements take depthwise.c's channels-last task (blocks of 64 channels):
    the same bits at every dispatch level, the numpy path within rounding, epilogue included."""

    x = _r(2, c, hw, hw)
    w, b = _r(c, 1, k, k), _r(c)
    kw = {"group": c, "pads": [pads] * 4, "strides": [s, s], "activation_act": 1, "activation_lo": -1.0,
          "activation_hi": 3.0}
    _same_at_every_level_and_near_numpy(x, w, b, kw)


@pytest.mark.parametrize(("c", "hw", "k", "d", "pads"), [(200, 4, 5, 2, 4), (67, 4, 3, 1, 1), (576, 2, 5, 1, 2)])
def test_small_plane_depthwise_on_the_pool_is_the_same_for_every_thread_count(c, hw, k, d, pads):
    """The channels-last task on the pool (LRASPP's 4x4 planes under a 5x5 kernel of dilation 2: only 9 of the
    25 taps read inside the input; a partial last block; MobileNetV3's 2x2 planes): the same bits on 1, 2
    and 3 threads and at every level, and onnxruntime's values."""
    from onnx_prepared.kernels import native
    from onnx_prepared.kernels.conv_fused import fused_conv

    x = _r(2, c, hw, hw)
    w, b = _r(c, 1, k, k), _r(c)
    kw = {"group": c, "pads": [pads] * 4, "dilations": [d, d], "activation_act": 1}
    _same_at_every_level_and_near_numpy(x, w, b, kw)
    before, outs = native.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            native.set_num_threads(t)
            outs.append(fused_conv(x, w, b, **kw)[0])
    finally:
        native.set_num_threads(before)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    check_ort("Conv", [x, w, b], opset=11, group=c, pads=[pads] * 4, dilations=[d, d])


@pytest.mark.parametrize(("n", "c", "hw", "k", "s", "d", "pads"), [
    (1, 72, 16, 3, 2, 1, [1, 1, 1, 1]),  # MobileNetV3's stride-2 block
    (1, 16, 32, 3, 2, 1, [1, 1, 1, 1]),  # MobileNetV3's first block: one whole 16-lane block
    (1, 24, 6, 3, 1, 1, [1, 1, 1, 1]),  # narrow plane read whole, a block of 8 transposed channels
    (2, 21, 9, 3, 1, 1, [1, 0, 2, 1]),  # partial channel block at every level, asymmetric pads
    (1, 40, 12, 5, 2, 2, [4, 4, 4, 4]),  # dilated
    (1, 17, 4, 5, 1, 1, [2, 2, 2, 2]),  # a small plane in blocks (not mostly pads)
    (1, 3, 90, 3, 1, 1, [1, 1, 1, 1]),  # padded block too large for the blocked task: per-plane task
])
def test_channel_blocked_depthwise_is_the_same_at_every_level_and_matches_numpy(n, c, hw, k, s, d, pads):
    """One-channel groups (mult 1) run in depthwise.c's channel blocks (as many channels as the level's vector
    has lanes): the same bits at every dispatch level and as the per-plane task, the numpy path within
    rounding, epilogue included."""

    x = _r(n, c, hw, hw)
    w, b = _r(c, 1, k, k), _r(c)
    kw = {"group": c, "pads": pads, "strides": [s, s], "dilations": [d, d], "activation_act": 1,
          "activation_lo": -1.0, "activation_hi": 3.0}
    _same_at_every_level_and_near_numpy(x, w, b, kw)
    check_ort("Conv", [x, w, b], opset=11, group=c, pads=pads, strides=[s, s], dilations=[d, d])


@pytest.mark.parametrize(("c", "hw", "k", "s"), [(64, 32, 3, 2), (72, 16, 3, 1), (16, 32, 3, 1), (21, 17, 5, 1)])
def test_channel_blocked_depthwise_on_the_pool_is_the_same_for_every_thread_count(c, hw, k, s):
    """The channel blocks run on the pool from 2^16 multiply-adds (MobileNetV3's early layers, a partial
    last block): the same bits on 1, 2 and 3 threads."""
    from onnx_prepared.kernels import native
    from onnx_prepared.kernels.conv_fused import fused_conv

    x = _r(1, c, hw, hw)
    w, b = _r(c, 1, k, k), _r(c)
    kw = {"group": c, "pads": [k // 2] * 4, "strides": [s, s], "activation_act": 1}
    before, outs = native.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            native.set_num_threads(t)
            outs += [fused_conv(x, w, b, **kw)[0] for _ in range(3)]
    finally:
        native.set_num_threads(before)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])


@pytest.mark.parametrize(("xs", "ws", "attrs"), [
    ((1, 12, 7, 7), (20, 12, 1, 1), {}),  # pointwise SGEMM
    ((1, 6, 9, 8), (10, 6, 3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 1]}),  # im2col + SGEMM
    ((1, 16, 5, 5), (32, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}),  # depthwise, multiplier 2
    ((3, 8, 4, 4), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # batched small planes: conv_core merges
])
def test_prepacked_conv_plans_equal_conv_core(xs, ws, attrs):
    """PackedConv's per-shape plans compute exactly what conv_core does, at every level, and fall back to
    conv_core when the extension goes away after the plan was made."""
    from onnx_prepared.kernels import conv_prepacked as cp
    from onnx_prepared.kernels import native

    x, w, b = _r(*xs), _r(*ws), _r(ws[0])

    class Node:
        domain, op_type = "", "Conv"

    spec = cp.conv_rule(Node, dict(attrs), frozenset({1, 2}), {1: (ws, "float32"), 2: ((ws[0],), "float32")})
    packed, k = spec.pack(w), spec.kernel
    for level in native.supported_levels():
        with native.forced_level(level):
            for _ in range(2):  # the plan is made, then used
                (y,) = k(packed, x, b, lo=0.0, hi=6.0, act=1)
                (ref,) = cp.conv_packed(packed, x, b, kshape=k.kshape, group=k.group, panel_rows=k.panel_rows,
                                        lo=0.0, hi=6.0, act=1, **k.attrs)
                np.testing.assert_array_equal(y, ref)
    saved = native._ext
    try:
        native._ext = None
        (slow,) = k(packed, x, b, lo=0.0, hi=6.0, act=1)
    finally:
        native._ext = saved
    np.testing.assert_allclose(slow, y, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not __import__("onnx_prepared.kernels.native", fromlist=["x"]).available(),
                    reason="native extension not built")
@pytest.mark.parametrize(("xs", "plan", "merge_from"), [((1, 24, 4, 4), "pointwise", None),
                                                       ((3, 24, 2, 2), "pointwise", None),
                                                       ((3, 24, 2, 2), "merged", 0)])
def test_unit_stride_1x1_conv_plans_skip_im2col(xs, plan, merge_from, monkeypatch):
    """A 1x1 Conv of unit strides and no pads reads its input as the GEMM's columns (no im2col copy): the
    geometry's strides are a tuple, and a list comparison once sent every 1x1 Conv through im2col
    (MobileNetV3's 576 -> 96 at 2x2: 9.5 -> 3.1 us); a batch of small planes, per image below the merge
    threshold's weights, merged from it."""
    from onnx_prepared.kernels import conv_prepacked as cp

    if merge_from is not None:
        monkeypatch.setattr(cp, "_MERGE_MIN_WEIGHTS", merge_from)

    ws = (40, xs[1], 1, 1)
    x, w, b = _r(*xs), _r(*ws), _r(ws[0])

    class Node:
        domain, op_type = "", "Conv"

    attrs = {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1]}
    spec = cp.conv_rule(Node, attrs, frozenset({1, 2}), {1: (ws, "float32"), 2: ((ws[0],), "float32")})
    k = spec.kernel.with_epilogue(0.0, 6.0)
    (y,) = k(spec.pack(w), x, b)
    assert k._plans[x.shape][1].__name__ == plan
    ref = np.clip(np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x) + b[:, None, None], 0.0, 6.0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
