"""DequantizeLinear / QuantizeLinear kernels against onnx.reference: per-tensor, per-axis, blocked."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.kernels.onnx_node_check import assert_same, check, run_ort, run_ours

RNG = np.random.default_rng(5)
INT_TYPES = [np.uint8, np.int8, np.uint16, np.int16, ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2,
             ml_dtypes.uint2]


def _q(shape, dtype):
    info = ml_dtypes.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _scale(shape, dtype=np.float32):
    return (RNG.random(shape) * 0.1 + 0.01).astype(dtype)


@pytest.mark.parametrize("dtype", INT_TYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("with_zp", [False, True])
def test_dequantize_per_tensor(dtype, with_zp):
    x = _q((3, 4), dtype)
    inputs = [x, np.array(0.05, np.float32)] + ([_q((), dtype)] if with_zp else [])
    (y,) = check("DequantizeLinear", inputs, opset=21, rtol=1e-6)
    assert y.dtype == np.float32


@pytest.mark.parametrize("opset", [10, 13])
def test_dequantize_old_opsets_vs_onnxruntime(opset):
    """onnx.reference has no DequantizeLinear before 19, so these versions are checked against ORT."""
    pytest.importorskip("onnxruntime")
    cases = [[_q((2, 5), np.uint8), np.array(0.1, np.float32), np.array(128, np.uint8)],
             [_q((2, 5), np.int8), np.array(0.1, np.float32)],
             [_q((2, 5), np.int32), np.array(0.1, np.float32)]]
    if opset >= 13:
        cases.append([_q((2, 5), np.int8), _scale((5,)), _q((5,), np.int8)])
    for inputs in cases:
        attrs = {"axis": 1} if opset >= 13 else {}
        assert_same(run_ours("DequantizeLinear", inputs, opset=opset, **attrs),
                    run_ort("DequantizeLinear", inputs, opset=opset, out_elem=TensorProto.FLOAT, **attrs))


def test_dequantize_opset19():
    check("DequantizeLinear", [_q((2, 5), np.uint8), np.array(0.1, np.float32), np.array(128, np.uint8)], opset=19)


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("dtype", [np.int8, ml_dtypes.int4])
def test_dequantize_per_axis(axis, dtype):
    x = _q((2, 3, 4), dtype)
    n = x.shape[axis]
    check("DequantizeLinear", [x, _scale((n,)), _q((n,), dtype)], opset=21, axis=axis, rtol=1e-6)


@pytest.mark.parametrize(("shape", "axis", "block"), [((4, 6), 1, 2), ((4, 6), 0, 2), ((4, 7), 1, 3), ((5, 4), 0, 2),
                                                      ((2, 3, 8), -1, 4), ((2, 3, 8), 1, 3), ((4, 6), 1, 6)])
@pytest.mark.parametrize("dtype", [np.uint8, ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("with_zp", [False, True])
def test_dequantize_blocked(shape, axis, block, dtype, with_zp):
    ax = axis % len(shape)
    pshape = list(shape)
    pshape[ax] = -(-shape[ax] // block)
    inputs = [_q(shape, dtype), _scale(pshape)] + ([_q(pshape, dtype)] if with_zp else [])
    check("DequantizeLinear", inputs, opset=21, axis=axis, block_size=block, rtol=1e-6)


def test_dequantize_blocked_shape_mismatch_raises():
    with pytest.raises(ValueError, match="blocked"):
        run_ours("DequantizeLinear", [_q((4, 6), np.int8), _scale((4, 2))], opset=21, axis=1, block_size=2)


@pytest.mark.parametrize("scale_dtype", [np.float16, ml_dtypes.bfloat16])
def test_dequantize_half_scales(scale_dtype):
    (y,) = check("DequantizeLinear", [_q((3, 4), np.int8), _scale((4,), scale_dtype), _q((4,), np.int8)], opset=21,
                 axis=1, rtol=1e-2)
    assert y.dtype == scale_dtype


def test_dequantize_output_dtype():
    (y,) = check("DequantizeLinear", [_q((3, 4), np.uint8), _scale(()), _q((), np.uint8)], opset=23,
                 output_dtype=TensorProto.FLOAT16, rtol=1e-3)
    assert y.dtype == np.float16


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.FLOAT4E2M1])
def test_dequantize_float8_float4(to):
    np_to = helper.tensor_dtype_to_np_dtype(to)
    x = np.array([0, 0.5, -1.5, 3, 6, -6], np.float32).astype(np_to)
    check("DequantizeLinear", [x, np.array(2.0, np.float32), np.zeros((), np_to)], opset=23)


def test_dequantize_scalar_input():
    (y,) = check("DequantizeLinear", [np.array(7, np.uint8), np.array(0.5, np.float32), np.array(1, np.uint8)],
                 opset=21)
    assert y.shape == ()


# **** QuantizeLinear ****


@pytest.mark.parametrize("dtype", INT_TYPES, ids=lambda d: np.dtype(d).name)
def test_quantize_per_tensor_rounds_half_even_and_saturates(dtype):
    x = np.array([0.0, 0.5, 1.5, 2.5, -0.5, -1.5, 10.0, -10.0, 1000.0, -1000.0, 0.26], np.float32)
    info = ml_dtypes.iinfo(dtype)
    zp = np.array(min(max(1, info.min), info.max), dtype)
    check("QuantizeLinear", [x, np.array(0.5, np.float32), zp], opset=21)


def test_quantize_default_uint8_and_old_opsets():
    x = (RNG.standard_normal((3, 4)) * 20).astype(np.float32)
    for opset in (10, 13, 19):
        (y,) = check("QuantizeLinear", [x, np.array(0.5, np.float32)], opset=opset)
        assert y.dtype == np.uint8
        check("QuantizeLinear", [x, np.array(0.5, np.float32), np.array(-3, np.int8)], opset=opset)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis(axis):
    x = (RNG.standard_normal((3, 4, 5)) * 3).astype(np.float32)
    n = x.shape[axis]
    check("QuantizeLinear", [x, _scale((n,)), _q((n,), np.int8)], opset=21, axis=axis)


@pytest.mark.parametrize(("shape", "axis", "block"), [((4, 6), 1, 2), ((4, 7), 1, 3), ((6, 4), 0, 4)])
@pytest.mark.parametrize("dtype", [np.int8, ml_dtypes.int4])
def test_quantize_blocked(shape, axis, block, dtype):
    x = (RNG.standard_normal(shape) * 0.3).astype(np.float32)
    pshape = list(shape)
    pshape[axis] = -(-shape[axis] // block)
    check("QuantizeLinear", [x, _scale(pshape), _q(pshape, dtype)], opset=21, axis=axis, block_size=block)


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(to, saturate):
    x = np.array([0.0, 1.0, -3.0, 100.0, 1e6, -1e6, np.inf], np.float32)
    zp = np.zeros((), helper.tensor_dtype_to_np_dtype(to))
    check("QuantizeLinear", [x, np.array(0.5, np.float32), zp], opset=21, saturate=saturate)


def test_quantize_output_dtype_and_float16_input():
    x = (RNG.standard_normal((3, 4)) * 3).astype(np.float16)
    (y,) = check("QuantizeLinear", [x, np.array(0.1, np.float16)], opset=21, output_dtype=TensorProto.INT8)
    assert y.dtype == np.int8
    with pytest.raises(ValueError, match="output_dtype"):
        run_ours("QuantizeLinear", [x, np.array(0.1, np.float16), np.array(0, np.uint8)], opset=21,
                 output_dtype=TensorProto.INT8)


def test_quantize_dequantize_roundtrip_int4_blocked():
    w = (RNG.standard_normal((8, 16)) * 0.2).astype(np.float32)
    scale = (np.abs(w).reshape(8, 4, 4).max(axis=2) / 7).astype(np.float32)
    (q,) = run_ours("QuantizeLinear", [w, scale, np.zeros((8, 4), ml_dtypes.int4)], opset=21, axis=1, block_size=4)
    (back,) = run_ours("DequantizeLinear", [q, scale], opset=21, axis=1, block_size=4)
    assert q.dtype == ml_dtypes.int4
    assert np.abs(back - w).max() <= scale.max() / 2 + 1e-6
