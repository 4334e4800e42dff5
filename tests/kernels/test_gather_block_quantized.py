"""GatherBlockQuantized against onnxruntime: packed uint8 (bits 4 and 8), int4/uint4 tables, zero points,
negative and out-of-range indices, gather_axis != quantize_axis and (for int4) equal axes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels._int4 import pack_bits
from onnx_prepared.kernels.gather_block_quantized import gather_block_quantized

ort = pytest.importorskip("onnxruntime")


def _ort(data, indices, scales, zp, **attrs):
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    names = ["data", "indices", "scales"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
        names.append("zp")
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain="com.microsoft", **attrs)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("indices", TensorProto.INT64, indices.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"indices": indices})[0]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("cols", [64, 80])
def test_uint8_packed_table(bits, with_zp, cols):
    rng = np.random.default_rng(bits + cols + with_zp)
    rows, bs = 10, 32
    nb = -(-cols // bs)
    q = rng.integers(0, 1 << bits, (rows, cols))
    data = pack_bits(q, bits)
    scales = rng.random((rows, nb)).astype(np.float32)
    zp = pack_bits(rng.integers(0, 1 << bits, (rows, nb)), bits) if with_zp else None
    idx = np.array([[0, 3, 9], [-1, 2, 2]], np.int64)
    attrs = {"bits": bits, "block_size": bs, "gather_axis": 0, "quantize_axis": 1}
    (got,) = gather_block_quantized(data, idx, scales, zp, **attrs)
    want = _ort(data, idx, scales, zp, **attrs)
    assert got.shape == want.shape == (2, 3, cols)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("axes", [(0, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("with_zp", [False, True])
def test_int4_tables(signed, axes, with_zp):
    from onnx import helper as h

    rng = np.random.default_rng(int(signed) * 7 + axes[0] * 3 + axes[1] + with_zp)
    shape, bs = (40, 48), 16
    ga, qa = axes
    lo, hi = (-8, 8) if signed else (0, 16)
    ttype = TensorProto.INT4 if signed else TensorProto.UINT4
    q = rng.integers(lo, hi, shape)
    data = numpy_helper.to_array(h.make_tensor("d", ttype, shape, q.ravel().tolist()))
    sshape = list(shape)
    sshape[qa] = -(-shape[qa] // bs)
    scales = rng.random(sshape).astype(np.float32)
    zp = None
    if with_zp:
        zp = numpy_helper.to_array(h.make_tensor("z", ttype, sshape, rng.integers(lo, hi, sshape).ravel().tolist()))
    idx = np.array([1, -2, 5, 7], np.int64)
    attrs = {"block_size": bs, "gather_axis": ga, "quantize_axis": qa}
    (got,) = gather_block_quantized(data, idx, scales, zp, **attrs)
    want = _ort(data, idx, scales, zp, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_out_of_range_index_gives_zeros():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (4, 32))
    scales = rng.random((4, 1)).astype(np.float32)
    (got,) = gather_block_quantized(pack_bits(q, 4), np.array([1, 9]), scales, block_size=32)
    np.testing.assert_array_equal(got[1], 0)
    np.testing.assert_allclose(got[0], (q[1] - 8) * scales[1, 0], rtol=1e-6)


def test_bad_scales_shape_raises():
    with pytest.raises(KernelError, match="scales shape"):
        gather_block_quantized(np.zeros((4, 16), np.uint8), np.array([0]), np.ones((4, 2), np.float32),
                               block_size=32)


@pytest.mark.parametrize("with_zp", [False, True])
def test_tied_embedding_rows_bit_equal(with_zp, monkeypatch):
    """genai's tied INT4 embedding (packed uint8, whole blocks; the native pass when built): bit-equal to
    onnxruntime and to the numpy path, negative and outside indices included."""
    from onnx_prepared.kernels import native

    rng = np.random.default_rng(5 + with_zp)
    rows, cols, bs = 50, 256, 32
    data = pack_bits(rng.integers(0, 16, (rows, cols)), 4)
    scales = (rng.standard_normal((rows, cols // bs)) * 0.1).astype(np.float32)
    zp = pack_bits(rng.integers(0, 16, (rows, cols // bs)), 4) if with_zp else None
    idx = np.array([[7], [-3], [49]], np.int64)
    attrs = {"bits": 4, "block_size": bs, "gather_axis": 0, "quantize_axis": 1}
    (got,) = gather_block_quantized(data, idx, scales, zp, **attrs)
    assert np.array_equal(got, _ort(data, idx, scales, zp, **attrs))
    (outside,) = gather_block_quantized(data, np.array([2, 50, -51]), scales, zp, **attrs)
    np.testing.assert_array_equal(outside[1:], 0)
    monkeypatch.setattr(native, "_ext", None)
    (numpy_path,) = gather_block_quantized(data, idx, scales, zp, **attrs)
    assert np.array_equal(got, numpy_path)
