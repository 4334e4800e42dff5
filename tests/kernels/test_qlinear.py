"""QLinear ops (onnxruntime's static QOperator quantization) against onnxruntime, integer outputs bit for bit.

Signed weights stay within [-63, 63], as ``quantize_static(reduce_range=True)`` writes them: on CPUs
without VNNI onnxruntime's u8 x s8 GEMM adds int16 pairs with saturation (``vpmaddubsw``), and past that
range it would no longer compute the sums the ONNX definition states (ours always does).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import qlinear as Q

MS = "com.microsoft"


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _ints(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


def _model(op, ins, out_elem, domain="", opset=17, **attrs):
    names = [f"x{i}" if v is not None else "" for i, v in enumerate(ins)]
    node = helper.make_node(op, names, ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, ins) if n],
        [helper.make_tensor_value_info("y", out_elem, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m, {n: v for n, v in zip(names, ins) if n}


def both(op, ins, out_elem=None, domain=MS, **attrs):
    """(ours through a session, onnxruntime's) for one node."""
    import onnxruntime as ort

    import onnx_prepared

    out_elem = out_elem or helper.np_dtype_to_tensor_dtype(ins[0].dtype)
    m, feeds = _model(op, ins, out_elem, domain, **attrs)
    sess = onnx_prepared.InferenceSession(m.SerializeToString())
    assert not any(k.is_fallback for k in sess._rt.resolved.kernels), f"{op} went to the fallback"
    ours = sess.run(None, feeds)[0]
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, ref


def _same(ours, ref):
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, (ours.dtype, ours.shape, ref.dtype, ref.shape)
    np.testing.assert_array_equal(ours, ref)


SHAPES = [((4, 32, 9, 9), (4, 32, 9, 9)), ((4, 32, 9, 9), (1, 32, 1, 1)), ((1, 32, 1, 1), (4, 32, 9, 9)),
          ((3, 40), (1,)), ((1,), (3, 40)), ((3, 7), (7,)), ((3, 1), (3, 7)), ((2, 3, 1), (2, 1, 5))]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary_ops_match_onnxruntime(op, shapes, dtype):
    rng = _rng(op, shapes, dtype)
    for _ in range(3):
        a, b = _ints(rng, dtype, shapes[0]), _ints(rng, dtype, shapes[1])
        scales = [np.array(v, np.float32) for v in rng.random(3) * 0.1 + 0.003]
        zps = [np.array(v, dtype) for v in _ints(rng, dtype, 3)]
        _same(*both(op, [a, scales[0], zps[0], b, scales[1], zps[1], scales[2], zps[2]]))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool_matches_onnxruntime(dtype, channels_last):
    rng = _rng("gap", dtype, channels_last)
    for shape in ((2, 16, 7, 7), (1, 8, 5), (1, 3, 4, 2, 3)):
        x = _ints(rng, dtype, shape)
        ins = [x, np.array(rng.random() * 0.1 + 0.01, np.float32), np.array(_ints(rng, dtype, ()), dtype),
               np.array(rng.random() * 0.05 + 0.005, np.float32), np.array(_ints(rng, dtype, ()), dtype)]
        _same(*both("QLinearGlobalAveragePool", ins, channels_last=channels_last))


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("quantized_out", [False, True])
@pytest.mark.parametrize("trans", [(0, 1), (1, 0)])
def test_qgemm_matches_onnxruntime(per_column, quantized_out, trans):
    rng = _rng("qgemm", per_column, quantized_out, trans)
    m, k, n = 5, 40, 12
    a = _ints(rng, np.uint8, (k, m) if trans[0] else (m, k))
    b = _ints(rng, np.int8, (n, k) if trans[1] else (k, n), -63, 63)
    bs = (rng.random(n if per_column else 1) * 0.01 + 0.001).astype(np.float32)
    bz = np.zeros(n if per_column else 1, np.int8)
    c = _ints(rng, np.int32, (n,), -1000, 1000)
    ins = [a, np.array(0.02, np.float32), np.array(7, np.uint8), b, bs, bz, c]
    if quantized_out:
        ins += [np.array(0.05, np.float32), np.array(120, np.uint8)]
    ours, ref = both("QGemm", ins, TensorProto.UINT8 if quantized_out else TensorProto.FLOAT, alpha=0.5,
                     transA=trans[0], transB=trans[1])
    _same(ours, ref)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize(("shape", "w_shape", "attrs"), [
    ((1, 8, 12, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 256, 4, 4), (8, 256, 3, 3), {"pads": [1, 1, 1, 1]}),  # K * 63 * 255 > 2**24: float32 channel chunks
    ((1, 512, 3, 3), (8, 256, 3, 3), {"group": 2}),  # the same bound, grouped: float64
    ((1, 4, 10), (6, 4, 3), {"dilations": [2]}),
], ids=["3x3", "depthwise-s2", "wide-k-chunks", "wide-k-grouped-f64", "1d-dilated"])
def test_qlinear_conv_matches_onnxruntime(dtype, per_channel, shape, w_shape, attrs):
    rng = _rng("qconv", dtype, per_channel, shape)
    m = w_shape[0]
    x = _ints(rng, dtype, shape)
    w = _ints(rng, np.int8, w_shape, -63, 63)
    ws = (rng.random(m) * 0.02 + 0.001).astype(np.float32) if per_channel else np.array(0.01, np.float32)
    wz = np.zeros(m, np.int8) if per_channel else np.array(0, np.int8)
    ins = [x, np.array(0.03, np.float32), np.array(_ints(rng, dtype, ()), dtype), w, ws, wz,
           np.array(0.05, np.float32), np.array(_ints(rng, dtype, ()), dtype), _ints(rng, np.int32, (m,), -500, 500)]
    _same(*both("QLinearConv", ins, domain="", **attrs))


@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_matches_onnxruntime(per_column):
    rng = _rng("qmatmul", per_column)
    for a_shape in ((5, 64), (2, 3, 64)):
        a = _ints(rng, np.uint8, a_shape)
        b = _ints(rng, np.int8, (64, 10), -63, 63)
        bs = (rng.random(10) * 0.01 + 0.001).astype(np.float32) if per_column else np.array(0.01, np.float32)
        bz = np.zeros(10, np.int8) if per_column else np.array(0, np.int8)
        ins = [a, np.array(0.02, np.float32), np.array(5, np.uint8), b, bs, bz, np.array(0.07, np.float32),
               np.array(100, np.uint8)]
        _same(*both("QLinearMatMul", ins, domain=""))


def test_conv_weights_are_derived_once_per_array_and_dropped_with_it():
    w = np.ones((8, 256, 3, 3), np.int8)
    work, chunks = Q._conv_weights(w, 0, 1, 255)
    assert work == np.float32 and [c[:2] for c in chunks] == [(0, 256)]
    assert Q._conv_weights(w, 0, 1, 255)[1][0][2] is chunks[0][2]
    w63 = np.full((8, 256, 3, 3), 63, np.int8)
    work, chunks = Q._conv_weights(w63, 0, 1, 255)  # 9 * 63 * 255 per channel: 116 channels per chunk
    assert work == np.float32 and [c[:2] for c in chunks] == [(0, 116), (116, 232), (232, 256)]
    assert Q._conv_weights(w63, 0, 2, 255)[0] == np.float64
    n = len(Q._DERIVED)
    del w, w63, chunks
    assert len(Q._DERIVED) == n - 3


def test_bad_parameters_name_the_input():
    a = np.zeros((2, 3), np.uint8)
    s, z = np.array(0.1, np.float32), np.array(0, np.uint8)
    with pytest.raises(KernelError, match="B_scale"):
        Q.qlinear_add(a, s, z, a, np.ones(2, np.float32), z, s, z)
    with pytest.raises(KernelError, match="share one element type"):
        Q.qlinear_mul(a, s, z, a.astype(np.int8), s, np.array(0, np.int8), s, z)
    with pytest.raises(KernelError, match="rank >= 3"):
        Q.qlinear_global_average_pool(a, s, z, s, z)
    with pytest.raises(KernelError, match="outside"):
        Q.qlinear_global_average_pool(np.zeros((1, 1, 2, 2), np.uint8), np.array(1e3, np.float32), z, s, z)
    with pytest.raises(KernelError, match="1 or N=4"):
        Q.qgemm(np.zeros((2, 3), np.uint8), s, z, np.zeros((3, 4), np.int8), np.ones(3, np.float32),
                np.zeros(3, np.int8))
