"""DynamicQuantizeLinear and MatMulInteger against onnxruntime: every output bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.helpers.ort_int8 import ort_u8s8_saturates, saturated_u8s8
from tests.kernels.onnx_node_check import assert_same, run_ort, run_ours

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(13)
DQL_OUT = [TensorProto.UINT8, TensorProto.FLOAT, TensorProto.UINT8]


def _dql_cases():
    yield RNG.standard_normal((4, 33)).astype(np.float32)
    yield (RNG.random((2, 3, 5)) * 7 + 1).astype(np.float32)  # all positive: min widened to 0
    yield -(RNG.random((17,)) * 3).astype(np.float32)  # all negative: max widened to 0
    yield np.zeros((3, 3), np.float32)  # empty range: scale 1
    yield np.array([-1.0, 0.0, 1.0, 0.5, -0.5, 254.0 / 255.0], np.float32)  # ties of the rounding
    yield (RNG.standard_normal((64, 768)) * 4).astype(np.float32)


@pytest.mark.parametrize("x", list(_dql_cases()), ids=lambda x: "x".join(map(str, x.shape)))
def test_dynamic_quantize_linear_matches_onnxruntime(x):
    ours = run_ours("DynamicQuantizeLinear", [x], opset=11, n_outputs=3)
    ref = run_ort("DynamicQuantizeLinear", [x], opset=11, n_outputs=3, out_elem=DQL_OUT)
    assert_same(ours, ref, rtol=0.0)


def _q(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


@pytest.mark.parametrize("a_t,b_t", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("k", [7, 300, 3072])  # float32 exact, then float64 products
def test_matmul_integer_matches_onnxruntime(a_t, b_t, k):
    a, b = _q((2, 5, k), a_t), _q((k, 6), b_t)
    cases = [[a, b], [a, b, _q((), a_t), _q((), b_t)], [a, b, None, _q((6,), b_t)]]
    for inputs in cases:
        if a_t == np.int8 and len(inputs) > 2 and inputs[3] is not None and inputs[3].ndim == 1:
            continue  # onnxruntime's int8 x int8 kernel takes per-tensor zero points only
        ours = run_ours("MatMulInteger", inputs, opset=10)
        if (a_t, b_t) == (np.uint8, np.int8) and ort_u8s8_saturates():
            ref = [_exact(*inputs)]  # onnxruntime saturates int16 pairs here: see the test below
        else:
            ref = run_ort("MatMulInteger", inputs, opset=10, out_elem=TensorProto.INT32)
        assert_same(ours, ref)


def _exact(a, b, azp=None, bzp=None):
    """The ONNX spec's MatMulInteger: int32 product of the zero-point-centred operands."""
    a = a.astype(np.int64) - (0 if azp is None else np.asarray(azp, np.int64))
    b = b.astype(np.int64) - (0 if bzp is None else np.asarray(bzp, np.int64))
    return (a @ b).astype(np.int32)


def test_u8s8_is_exact_where_onnxruntime_saturates():
    """Full-range u8 x s8 operands: ours is the exact int32 product; onnxruntime's is too, unless its
    CPU kernel sums pairs in saturating int16 (no VNNI), in which case it is exactly that saturated sum."""
    a, b = np.full((3, 40), 255, np.uint8), np.full((40, 5), 127, np.int8)
    b[::3] = -128
    (ours,) = run_ours("MatMulInteger", [a, b], opset=10)
    np.testing.assert_array_equal(ours, _exact(a, b))
    (theirs,) = run_ort("MatMulInteger", [a, b], opset=10, out_elem=TensorProto.INT32)
    expected_ort = saturated_u8s8(a, b) if ort_u8s8_saturates() else _exact(a, b)
    np.testing.assert_array_equal(theirs, expected_ort)


def test_matmul_integer_per_row_a_zero_point():
    a, b = _q((4, 9), np.uint8), _q((9, 3), np.int8)
    azp = _q((4,), np.uint8)
    (y,) = run_ours("MatMulInteger", [a, b, azp], opset=10)
    expected = (a.astype(np.int64) - azp[:, None]) @ b.astype(np.int64)
    np.testing.assert_array_equal(y, expected.astype(np.int32))
    assert y.dtype == np.int32
