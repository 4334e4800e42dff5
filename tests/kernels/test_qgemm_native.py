"""The native dynamic INT8 kernels (``_native/qgemm.c``): MatMulInteger on prepacked int16 pairs and
DynamicQuantizeLinear, at every dispatch level and without the extension.

MatMulInteger is compared with the integer product (the ONNX spec), not with onnxruntime: on AVX2
without VNNI onnxruntime's U8S8 kernel saturates the int16 sum of two u8 x s8 products (vpmaddubsw),
which :func:`test_no_int16_saturation` provokes. DynamicQuantizeLinear is compared with the numpy code
of the same module, which tests/kernels/test_quantize_dynamic.py holds to onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import native
from onnx_prepared.kernels import quantize_dynamic as qd

LEVELS = list(native.supported_levels()) or ["numpy"]
RNG = np.random.default_rng(1313)


def _q(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _expected(a, b, azp, bzp):
    a64 = a.astype(np.int64) - (0 if azp is None else np.asarray(azp, np.int64).reshape(-1)[0])
    b64 = b.astype(np.int64) - (0 if bzp is None else np.asarray(bzp, np.int64).reshape(-1))
    return np.matmul(a64, b64).astype(np.int32)


def _at(level, fn, *args, **kw):
    if level == "numpy":
        saved, native._ext = native._ext, None
        try:
            return fn(*args, **kw)
        finally:
            native._ext = saved
    with native.forced_level(level):
        return fn(*args, **kw)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("a_t,b_t", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8),
                                     (np.int8, np.uint8)])
@pytest.mark.parametrize("a_shape,n", [((1, 1), 1), ((5, 7), 3), ((2, 8, 32), 96), ((16, 128), 32), ((33, 301), 70),
                                       ((7,), 17), ((3, 2, 40, 768), 130)])
def test_packed_matmul_integer_is_the_integer_product(level, a_t, b_t, a_shape, n):
    k = a_shape[-1]
    a, b = _q(a_shape, a_t), _q((k, n), b_t)
    for azp, bzp in ((None, None), (_q((), a_t), _q((), b_t)), (_q((1,), a_t), _q((n,), b_t))):
        packed = qd.pack_b_pairs(b, bzp)
        (y,) = _at(level, qd.matmul_integer_packed, packed, a, azp, K=k, N=n)
        assert y.dtype == np.int32 and y.shape == a_shape[:-1] + (n,)
        np.testing.assert_array_equal(y, _expected(a, b, azp, bzp))


@pytest.mark.parametrize("level", LEVELS)
def test_no_int16_saturation(level):
    """255 * 127 + 255 * 127 > 32767: a vpmaddubsw kernel clamps every such pair, the integer sum does not."""
    a = np.full((4, 64), 255, np.uint8)
    b = np.full((64, 16), 127, np.int8)
    (y,) = _at(level, qd.matmul_integer_packed, qd.pack_b_pairs(b), a, None, K=64, N=16)
    assert (y == 64 * 255 * 127).all()


def test_packed_per_row_a_zero_point_and_bad_shapes():
    a, b = _q((4, 9), np.uint8), _q((9, 3), np.int8)
    azp = _q((4,), np.uint8)
    (y,) = qd.matmul_integer_packed(qd.pack_b_pairs(b), a, azp, K=9, N=3)
    np.testing.assert_array_equal(y, ((a.astype(np.int64) - azp[:, None]) @ b).astype(np.int32))
    with pytest.raises(qd.KernelError, match="does not match B"):
        qd.matmul_integer_packed(qd.pack_b_pairs(b), a[:, :8], None, K=9, N=3)
    with pytest.raises(qd.KernelError, match="b_zero_point"):
        qd.pack_b_pairs(b, np.zeros((2,), np.int8))


def test_pack_round_trips():
    b, bzp = _q((33, 21), np.uint8), _q((21,), np.uint8)
    packed = qd.pack_b_pairs(b, bzp)
    assert packed.shape == (17, 32, 2) and packed.dtype == np.int16
    np.testing.assert_array_equal(qd.unpack_b_pairs(packed, 33, 21), b.astype(np.int32) - bzp)


def _dql_cases():
    yield RNG.standard_normal((4, 33)).astype(np.float32)
    yield (RNG.random((2, 3, 5)) * 7 + 1).astype(np.float32)
    yield -(RNG.random((17,)) * 3).astype(np.float32)
    yield np.zeros((3, 3), np.float32)
    yield np.array([-1.0, 0.0, 1.0, 0.5, -0.5, 254.0 / 255.0, 3.5, -2.5], np.float32)
    yield (RNG.standard_normal((64, 768)) * 4).astype(np.float32)
    yield np.asfortranarray(RNG.standard_normal((9, 5)).astype(np.float32))
    yield np.array([1.0, np.nan, -2.0], np.float32)  # native declines: the numpy path
    yield np.array([1.0, np.inf, -2.0] * 5, np.float32)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x", list(_dql_cases()), ids=lambda x: "x".join(map(str, x.shape)))
def test_native_dynamic_quantize_linear_is_the_numpy_code(level, x):
    ref = _at("numpy", qd.dynamic_quantize_linear, x)
    got = _at(level, qd.dynamic_quantize_linear, x)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, r)


def test_session_prepacks_a_constant_b(tmp_path):
    """A MatMulInteger whose B and b_zero_point are initializers runs on the packed kernel in a session."""
    from onnx_prepared.runtime import RuntimeSession

    b, bzp = _q((40, 24), np.int8), _q((24,), np.int8)
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B", "azp", "bzp"], ["Y"])], "g",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [None, 40]),
         helper.make_tensor_value_info("azp", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [None, 24])],
        initializer=[numpy_helper.from_array(b, "B"), numpy_helper.from_array(bzp, "bzp")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    a, azp = _q((6, 40), np.uint8), np.array(131, np.uint8)
    path = str(tmp_path / "mmi.onnx")
    onnx.save(model, path)
    with RuntimeSession(path) as s:
        s.prepare()
        assert "mmi-b-i16pairs" in repr(s.plan.requirements)
        for _ in range(2):
            (y,) = s.run({"A": a, "azp": azp})
            np.testing.assert_array_equal(y, _expected(a, b, azp, bzp))
