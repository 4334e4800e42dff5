"""accuracy_level 4 is onnxruntime's MatMulNBits bit for bit at block sizes 16-256 and every native dispatch level.

Each test compares with onnxruntime in the order of the MLAS kernels it runs on this CPU
(``matmul_nbits.int8_order``; the other orders: ``test_matmul_nbits_order.py``).
onnxruntime 1.32 on AVX512-VNNI (MLAS SQ4BitGemmKernel_BlkSum_CompInt8) sums each output in 16 float chains
(which k values feed which chain depends on the block size), adds trailing blocks, folds the chains in a
fixed order (another one for the last N % 4 columns, and at block sizes 64-256 for an odd last row), adds
the bias and then the zero-point term, a separate chain over the blocks (``_native/nbits.h``). One flipped
rounding here moves an int8 rounding of the next layer's activations, so whole models drift apart
(``benchmarks/numerics.py``); hence equality, not a tolerance. Its AVX2 kernels sum in 8 chains over
64-k groups instead (``_native/nbits.h``). The shapes cover K not a multiple of the
block (trailing blocks and a partial one), N = 1 and N % 4 tails, odd M, M across the kernels' row tiles,
packed zero points, bias, and both pool splits.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_prepared.kernels import matmul_nbits as mm
from onnx_prepared.kernels import native
from tests.kernels.test_matmul_nbits import _ort, _weights

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")


def _run(A, B, scales, zp, bias, K, N, level, block_size=32):
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=block_size)
    with native.forced_level(level):
        return mm.matmul_nbits_packed(A, packed, bias, accuracy_level=4)[0]


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(K=st.integers(1, 600), N=st.integers(1, 70), M=st.sampled_from([1, 2, 3, 4, 5, 7, 9, 33]),
       zp_kind=st.sampled_from(["none", "packed"]), with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_block32_is_onnxruntimes_bits(K, N, M, zp_kind, with_bias, seed):
    rng = np.random.default_rng(seed)
    B, scales, zp = _weights(rng, K, N, 4, 32, zp_kind, False)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    A = rng.standard_normal((M, K)).astype(np.float32)
    want = _ort(A, B, scales, zp, bias, K=K, N=N, bits=4, block_size=32, accuracy_level=4)
    for level in native.supported_levels():
        got = _run(A, B, scales, zp, bias, K, N, level)
        assert np.array_equal(got, want), (level, int((got != want).sum()), float(np.abs(got - want).max()))


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(K=st.integers(1, 1100), N=st.integers(1, 40), M=st.sampled_from([1, 2, 3, 5, 8]),
       block_size=st.sampled_from([16, 64, 128, 256]), zp_kind=st.sampled_from(["none", "packed"]),
       with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_other_block_sizes_are_onnxruntimes_bits(K, N, M, block_size, zp_kind, with_bias, seed):
    rng = np.random.default_rng(seed)
    B, scales, zp = _weights(rng, K, N, 4, block_size, zp_kind, False)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    A = rng.standard_normal((M, K)).astype(np.float32)
    want = _ort(A, B, scales, zp, bias, K=K, N=N, bits=4, block_size=block_size, accuracy_level=4)
    for level in native.supported_levels():
        got = _run(A, B, scales, zp, bias, K, N, level, block_size)
        assert np.array_equal(got, want), (level, int((got != want).sum()), float(np.abs(got - want).max()))


@pytest.mark.parametrize(("M", "K", "N"), [(1, 1024, 1024), (16, 1024, 1536), (128, 2816, 64), (37, 1024, 67),
                                           (200, 320, 100)])
def test_llm_shapes_bit_exact_and_split_independent(M, K, N):
    """The shapes of a hidden-1024 Llama (split over the pool), and more rows than one task's 128 with
    trailing blocks, then on one thread: the same bits."""
    rng = np.random.default_rng(M + K + N)
    B, scales, zp = _weights(rng, K, N, 4, 32, "none", False)
    A = rng.standard_normal((M, K)).astype(np.float32)
    want = _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=32, accuracy_level=4)
    level = native.dispatch_level()
    np.testing.assert_array_equal(_run(A, B, scales, zp, None, K, N, level), want)
    threads = native.get_num_threads()
    native.set_num_threads(1)
    try:
        np.testing.assert_array_equal(_run(A, B, scales, zp, None, K, N, level), want)
    finally:
        native.set_num_threads(threads)


def test_zero_and_constant_blocks():
    """All-zero activation blocks (scale 0), a constant row and large values keep onnxruntime's bits."""
    rng = np.random.default_rng(5)
    K, N = 160, 36
    B, scales, zp = _weights(rng, K, N, 4, 32, "packed", False)
    A = rng.standard_normal((4, K)).astype(np.float32)
    A[0, :64] = 0.0
    A[1] = 3.0
    A[2] *= 1e4
    A[3, 32:96] = -1e-3
    want = _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=32, accuracy_level=4)
    for level in native.supported_levels():
        np.testing.assert_array_equal(_run(A, B, scales, zp, None, K, N, level), want)


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
def test_sixteen_block_groups_of_a(block_size, zp_kind):
    """A row of 16 and more whole blocks is quantized 16 blocks at a time (AVX-512), then the trailing and
    partial blocks one by one: zero, constant, tiny and huge blocks inside a group keep onnxruntime's bits."""
    rng = np.random.default_rng(block_size)
    K, N = 32 * block_size + 40, 20
    B, scales, zp = _weights(rng, K, N, 4, block_size, zp_kind, False)
    A = rng.standard_normal((3, K)).astype(np.float32)
    A[0, 3 * block_size:5 * block_size] = 0.0
    A[0, 9 * block_size:10 * block_size] = -2.5
    A[1, :block_size] *= 1e-30
    A[1, 17 * block_size:18 * block_size] *= 1e6
    A[2, -40:] = 0.0
    want = _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=block_size, accuracy_level=4)
    for level in native.supported_levels():
        got = _run(A, B, scales, zp, None, K, N, level, block_size)
        assert np.array_equal(got, want), (level, int((got != want).sum()))


@pytest.mark.parametrize("case", ["in_range", "tiny_weight_scales", "huge_weight_scales", "tiny_activations",
                                  "subnormal_products"])
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
def test_scaled_high_nibble_chains_and_their_fallback(case, zp_kind):
    """Tiles of 4 rows keep the high nibbles' chains 16x scaled when every weight and activation scale is 0 or
    within [2^-50, 2^48] (nbits_avx512vnni.c, scales_ok); a panel or a task with any other scale runs them
    unscaled. onnxruntime's bits either way, the scale products normal or subnormal."""
    rng = np.random.default_rng(7)
    K, N, M = 200, 52, 8
    B, scales, zp = _weights(rng, K, N, 4, 32, zp_kind, False)
    A = rng.standard_normal((M, K)).astype(np.float32)
    if case == "tiny_weight_scales":
        scales[17:20] *= np.float32(1e-20)  # one panel below 2^-50
    elif case == "huge_weight_scales":
        scales[40, 2] = np.float32(1e20)
    elif case == "tiny_activations":
        A[5] *= np.float32(1e-18)  # one row's scales below 2^-50
    elif case == "subnormal_products":
        scales[:16] *= np.float32(1e-25)
        A[:4] *= np.float32(1e-16)
    want = _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=32, accuracy_level=4)
    for level in native.supported_levels():
        got = _run(A, B, scales, zp, None, K, N, level)
        assert np.array_equal(got, want), (level, int((got != want).sum()))
