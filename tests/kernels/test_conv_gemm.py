"""Conv natively: the blocked sgemm over the pool (same values for every thread count, numpy's
within rounding), the batch joined into the GEMM's columns for small planes, and 2-D depthwise (depthwise.c)
against onnxruntime and the numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.kernels import _blas, native
from tests.kernels.onnx_node_check import check_ort

RNG = np.random.default_rng(21)


@pytest.fixture
def single_threaded_blas():
    before = _blas.current_threads()
    _blas.set_threads(1)
    yield
    if before is not None:
        _blas.set_threads(before)


@pytest.mark.skipif(not native.available() or _blas.sgemm_address() is None, reason="extension or OpenBLAS")
@pytest.mark.parametrize(("g", "m", "k", "p", "n"), [(1, 64, 147, 3000, 1), (1, 300, 200, 40, 2), (2, 8, 9, 70, 3),
                                                  (1, 5, 7, 3, 1)])
def test_native_conv_gemm_is_thread_count_independent(single_threaded_blas, g, m, k, p, n):
    a = RNG.standard_normal((g, m, k), dtype=np.float32)
    x = RNG.standard_normal((n, g, k, p), dtype=np.float32)
    before = native.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            native.set_num_threads(t)
            outs.append(native.conv_gemm(a, x))
    finally:
        native.set_num_threads(before)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    np.testing.assert_allclose(outs[0], np.matmul(a, x), rtol=1e-5, atol=1e-4)


def test_native_conv_gemm_declines_when_blas_is_threaded():
    if _blas.current_threads() is None:
        pytest.skip("no OpenBLAS")
    before = _blas.current_threads()
    try:
        _blas.set_threads(2)
        assert native.conv_gemm(np.zeros((1, 2, 2), np.float32), np.zeros((1, 1, 2, 2), np.float32)) is None
    finally:
        _blas.set_threads(before)


@pytest.mark.parametrize(("shape", "wshape", "attrs"), [
    ((3, 16, 4, 4), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # batch joins the columns (3 images x 16 positions)
    ((2, 8, 5, 5), (12, 8, 1, 1), {}),  # pointwise, batch joined
    ((2, 8, 6, 6), (12, 4, 3, 3), {"group": 2, "strides": [2, 2]}),  # grouped
    ((2, 6, 3, 3, 3), (4, 6, 2, 2, 2), {}),  # 3-D
])
def test_batched_small_planes_match_onnxruntime(single_threaded_blas, shape, wshape, attrs):
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal(wshape).astype(np.float32)
    b = RNG.standard_normal(wshape[0]).astype(np.float32)
    check_ort("Conv", [x, w, b], opset=11, **attrs)


DEPTHWISE = [
    ((1, 24, 9, 9), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 16, 10, 7), 1, (3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 2]}),
    ((1, 8, 11, 11), 2, (5, 5), {"pads": [2, 2, 2, 2], "dilations": [2, 1]}),  # channel multiplier 2
    ((1, 40, 4, 4), 1, (5, 5), {"pads": [2, 2, 2, 2]}),  # kernel larger than the plane
    ((1, 12, 8, 9), 1, (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ((1, 33, 15, 15), 1, (7, 7), {"auto_pad": "VALID"}),
]


@pytest.mark.parametrize(("shape", "mult", "k", "attrs"), DEPTHWISE)
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_matches_onnxruntime_and_the_numpy_path(shape, mult, k, attrs, bias, monkeypatch):
    c = shape[1]
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((c * mult, 1, *k)).astype(np.float32)
    inputs = [x, w] + ([RNG.standard_normal(c * mult).astype(np.float32)] if bias else [])
    (fast,) = check_ort("Conv", inputs, opset=11, group=c, **attrs)
    monkeypatch.setattr(native, "available", lambda: False)
    (slow,) = check_ort("Conv", inputs, opset=11, group=c, **attrs)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("shape", "mult", "k", "attrs"), [DEPTHWISE[1], DEPTHWISE[2]])
def test_depthwise_at_every_dispatch_level(level, shape, mult, k, attrs):
    c = shape[1]
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((c * mult, 1, *k)).astype(np.float32)
    with native.forced_level(level):
        check_ort("Conv", [x, w, RNG.standard_normal(c * mult).astype(np.float32)], opset=11, group=c, **attrs)
