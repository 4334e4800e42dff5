"""The native source kernel (``_ext.matmul_q4_source``, kernels/_native/module.c): a cold run's 4-bit
MatMulNBits packed a few panels per pool task and multiplied there. Its bits are the packed kernel's
(``matmul_q4`` on ``pack_q4``'s bytes) for every shape, zero-point kind, block size, row count and mode,
at every thread count and dispatch level; its panels go to the pool as tasks."""

import itertools

import numpy as np
import pytest

from onnx_prepared.kernels import _q4_panels as q4
from onnx_prepared.kernels import matmul_nbits as mnb
from onnx_prepared.kernels import native

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")


def _case(rng, K, N, bs, zp):
    kb = -(-K // bs)
    B = rng.integers(0, 256, (N, kb, bs // 2), dtype=np.uint8)
    scales = rng.random((N, kb), dtype=np.float32) + 0.1
    zps = {None: None, "u4": rng.integers(0, 256, (N, -(-kb // 2)), dtype=np.uint8),
           "f32": rng.random((N, kb), dtype=np.float32) * 15}[zp]
    return B, scales, zps


@pytest.fixture
def threads():
    before = native.get_num_threads()
    yield native.set_num_threads
    native.set_num_threads(before)


@pytest.mark.parametrize("level", native.supported_levels())
def test_source_kernel_gives_the_packed_kernels_bits(level, threads):
    """K past the last whole block, N not a multiple of 16, one row, an odd M whose last row MLAS's AVX2
    order runs through its one-row kernel (129), bias or none, accuracy level 0 and 4, on 1 and 2 threads."""
    rng = np.random.default_rng(7)
    with native.forced_level(level):
        for (K, N), bs, zp in itertools.product(((200, 40), (256, 600)), (16, 32, 128), (None, "u4", "f32")):
            B, scales, zps = _case(rng, K, N, bs, zp)
            packed = mnb.prepack_matmul_nbits(B, scales, zps, K=K, N=N, block_size=bs)
            for M, acc, n in itertools.product((1, 3, 129), (0, 4), (1, 2)):
                threads(n)
                A = rng.standard_normal((M, K)).astype(np.float32)
                bias = rng.standard_normal(N).astype(np.float32) if M != 3 else None
                (want,) = mnb.matmul_nbits_packed(A, packed, bias, accuracy_level=acc)
                (got,) = mnb.matmul_nbits_source(A, B, scales, zps, bias, K=K, N=N, block_size=bs,
                                                 accuracy_level=acc)
                assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), (K, N, bs, zp, M, acc, n)


def test_fp16_activations_and_scales_as_the_packed_kernel():
    rng = np.random.default_rng(3)
    B, scales, _ = _case(rng, 128, 48, 32, None)
    A = rng.standard_normal((4, 128)).astype(np.float16)
    packed = mnb.prepack_matmul_nbits(B, scales.astype(np.float16), None, K=128, N=48, block_size=32)
    (want,) = mnb.matmul_nbits_packed(A, packed)
    (got,) = mnb.matmul_nbits_source(A, B, scales.astype(np.float16), None, K=128, N=48, block_size=32)
    assert got.dtype == np.float16 and np.array_equal(want, got)


def test_panels_are_dispatched_to_the_pool_as_tasks(threads):
    """On 2 threads one call is one pooled job (A's preparation is too small to be one) of at least 4 tasks
    per thread, each a range of panels; on 1 thread the same tasks run on the caller (no job)."""
    rng = np.random.default_rng(5)
    K, N, M = 1024, 1024, 16
    B, scales, _ = _case(rng, K, N, 32, None)
    A = rng.standard_normal((M, K)).astype(np.float32)
    ext = native._ext

    def call():
        y = np.empty((M, N), np.float32)
        scratch = np.empty(ext.scratch_bytes(M, K, 32, 2), np.uint8)
        return ext.matmul_q4_source(A, B, scales, None, y, None, scratch, M, K, N, 32, q4.ZP_NONE, 2)

    threads(2)
    call()  # starts the workers
    jobs, _, _, _, tasks, solo = ext.pool_stats()
    n = call()
    jobs2, _, _, _, tasks2, solo2 = ext.pool_stats()
    assert n >= 4 * 2  # 64 panels: at least 4 tasks per thread
    assert (jobs2 - jobs, tasks2 - tasks) == (1, n) or solo2 - solo == 1  # pooled (or the pool's back-off)
    threads(1)
    jobs, *_ = ext.pool_stats()
    assert call() >= 1 and ext.pool_stats()[0] == jobs


def test_mismatched_zero_points_are_refused():
    rng = np.random.default_rng(0)
    B, scales, _ = _case(rng, 64, 16, 32, None)
    A = np.zeros((1, 64), np.float32)
    y = np.empty((1, 16), np.float32)
    scratch = np.empty(native._ext.scratch_bytes(1, 64, 32, 0), np.uint8)
    with pytest.raises(ValueError, match="zero points and zp_kind"):
        native._ext.matmul_q4_source(A, B, scales, None, y, None, scratch, 1, 64, 16, 32, q4.ZP_U4, 0)
    with pytest.raises(ValueError, match="scales holds"):
        native._ext.matmul_q4_source(A, B, scales[:8], None, y, None, scratch, 1, 64, 16, 32, q4.ZP_NONE, 0)
