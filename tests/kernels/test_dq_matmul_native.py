"""onnx_prepared::DynamicQuantizeMatMul with a prepacked B (quantize_dynamic's whole chain of one MatMul in
one native call, qgemm.c's dq_matmul_f32) against the unfused kernels on the numpy path: bit for bit, at
every dispatch level, for scalar and per-column scales, with and without bias, and large enough to split
over the pool; NaN input takes the numpy chain."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_prepared.kernels import native
from onnx_prepared.kernels import quantize_dynamic as qd
from tests.helpers.dispatch import PATHS, use_path

RNG = np.random.default_rng(31)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _unfused(A, W, scale, zp, bias):
    saved, native._ext = native._ext, None
    try:
        return qd.dynamic_quantize_matmul(A, W, scale, zp, bias)[0]
    finally:
        native._ext = saved


def _packed_kernel(K, N, W, zp):
    node = helper.make_node("DynamicQuantizeMatMul", ["A", "W", "s", "z", "b"], ["Y"], domain="onnx_prepared")
    spec = qd.dynamic_quantize_matmul_rule(node, {}, frozenset({1, 2, 3, 4}), {1: ((K, N), str(W.dtype))})
    assert spec is not None and spec.source_inputs == (1, 3)
    return spec.kernel, spec.pack(W, zp)


@pytest.mark.parametrize("shape,K,N", [((2, 8), 32, 96), ((2, 3, 32), 32, 128), ((5, 128), 128, 33), ((1, 7), 7, 1),
                                       ((70, 256), 256, 160)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_chain_is_the_unfused_kernels_bit_for_bit(path, shape, K, N, per_column, with_bias):
    A = (RNG.standard_normal(shape[:-1] + (K,)) * 3).astype(np.float32)
    W = RNG.integers(-128, 128, (K, N)).astype(np.int8)
    zp = np.array(RNG.integers(-3, 4), np.int8)
    scale = (RNG.random(N if per_column else ()) * 0.01 + 1e-3).astype(np.float32)
    bias = RNG.standard_normal(N).astype(np.float32) if with_bias else None
    run, packed = _packed_kernel(K, N, W, zp)
    (got,) = run(packed, A, scale, bias)
    want = _unfused(A, W, scale, zp, bias)
    assert got.dtype == np.float32 and got.shape == want.shape == A.shape[:-1] + (N,)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    (plain,) = qd.dynamic_quantize_matmul(A, W, scale, zp, bias)
    np.testing.assert_array_equal(plain, want)


def test_nan_input_takes_the_numpy_chain(path):
    K, N = 16, 8
    A = RNG.standard_normal((3, K)).astype(np.float32)
    A[1, 2] = np.nan
    W = RNG.integers(-128, 128, (K, N)).astype(np.int8)
    zp = np.array(0, np.int8)
    scale = np.array(0.01, np.float32)
    run, packed = _packed_kernel(K, N, W, zp)
    with np.errstate(invalid="ignore"):
        (got,) = run(packed, A, scale, None)
        want = _unfused(A, W, scale, zp, None)
    np.testing.assert_array_equal(got, want)
