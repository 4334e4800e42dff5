"""accuracy_level 4 follows the summation order of the MLAS kernels onnxruntime runs on the CPU, and each
order can be forced (``ONNX_PREPARED_NBITS_ORDER``), so every order is tested on every machine.

``test_matmul_nbits_exact.py`` compares the CPU's own order with onnxruntime bit for bit. Here a numpy
emulation of MLAS's AVX2 (and AVX-VNNI) CompInt8 kernels (written from sqnbitgemm_kernel_avx2*.h, the
order described in ``_native/nbits.h``) is first checked against onnxruntime where that is the CPU's order,
then the native kernels at every dispatch level are checked against it with the order forced; the AVX-512
order, forced, must give the portable level's bits at every level (the portable level is what the exact
tests compare with onnxruntime on an AVX-512 machine).

The emulation's fma is float64 ``a * b + c`` rounded to float32: the product of two float32 is exact in
float64, so it can only differ from a fused float32 fma by a double rounding, which the fixed seeds here
do not hit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import matmul_nbits as mm
from onnx_prepared.kernels import native
from tests.kernels.test_matmul_nbits import _ort, _weights

f32, f64 = np.float32, np.float64
#: chain l of a 64-k group takes chunk (8 k values) LC[l] of the group
LC = (0, 1, 4, 5, 2, 3, 6, 7)


def _fma(a, b, c):
    return (np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64)).astype(f32)


def _quantize_a(A, bs):
    M, K = A.shape
    kb = -(-K // bs)
    blk = np.zeros((M, kb * bs), f32)
    blk[:, :K] = A
    blk = blk.reshape(M, kb, bs)
    amax = np.abs(blk).max(axis=2).astype(f32)
    sa = (amax / f32(127)).astype(f32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, f32(127) / amax, f32(0)).astype(f32)
    q = np.rint((blk * inv[:, :, None]).astype(f32)).astype(np.int64)
    return q.reshape(M, kb * bs), sa, (sa * q.sum(axis=2).astype(f32)).astype(f32)


def _unpack(B, zp, N, bs):
    kb = B.shape[1]
    q = np.empty((N, kb, bs), np.int64)
    q[:, :, 0::2] = B & 15
    q[:, :, 1::2] = B >> 4
    z = np.full((N, kb), 8, np.int64)
    if zp is not None:
        zb = zp.reshape(N, -1).astype(np.int64)
        zz = np.stack([zb & 15, zb >> 4], axis=2).reshape(N, -1)
        z = zz[:, :kb]
    return q, z


def mlas_avx2_reference(A, B, scales, zp, bias, *, N, block_size, vnni=False):
    """MLAS's AVX2 (``vnni``: AVX-VNNI) CompInt8 MatMulNBits, emulated: 8 float chains per output."""
    bs, M = block_size, A.shape[0]
    qa, sa, ablk = _quantize_a(A, bs)
    qw, z = _unpack(B, zp, N, bs)
    sb = scales.reshape(N, -1).astype(f32)
    kb = qw.shape[1]
    bsum = (-(z.astype(f32) * sb)).astype(f32)
    n4 = N & ~3
    Y = np.empty((M, N), f32)
    for m in range(M):
        m1 = bs >= 32 and M % 128 == 1 and m == M - 1  # the one-row kernel: q - zero_point, no blksum GEMM
        w = ((qw - z[:, :, None]) if m1 else qw).reshape(N, kb * bs)

        def dot(k0, n, m=m, w=w):
            return (w[:, k0:k0 + n] * qa[m, k0:k0 + n][None, :]).sum(axis=1).astype(f32)

        def scale(b, m=m):
            return (sa[m, b] * sb[:, b]).astype(f32)

        X = np.zeros((8, N), f32)
        if m1 and bs == 32 and zp is not None:
            first_trailing = 0
        else:
            bpg = max(1, 64 // bs)
            groups = kb * bs // 64 if bs >= 64 else kb // bpg
            first_trailing = kb if bs >= 64 else groups * bpg
            for g in range(groups):
                for lane in range(8):
                    if vnni and bs >= 64 and not m1:
                        k0 = 64 * g
                        v = dot(k0 + 4 * lane, 4) + dot(k0 + 32 + 4 * lane, 4)
                    else:
                        k0 = 64 * g + 8 * LC[lane]
                        v = dot(k0, 8)
                    X[lane] = _fma(v, scale(k0 // bs), X[lane])
        step = 2 if bs == 16 else 4
        for b in range(first_trailing, kb):
            for lane in range(8):
                X[lane] = _fma(dot(b * bs + step * lane, step), scale(b), X[lane])
        y = (((X[0] + X[1]) + X[2]) + X[3]) + (((X[4] + X[5]) + X[6]) + X[7])
        t = [X[4 + i] + X[i] for i in range(4)]
        y[n4:] = ((t[0] + t[2]) + (t[1] + t[3]))[n4:]
        if bias is not None:
            y = (y + bias).astype(f32)
        if not m1:
            zt = np.zeros(N, f32)
            for b in range(kb):
                zt = _fma(ablk[m, b], bsum[:, b], zt)
            y = (y + zt).astype(f32)
        Y[m] = y
    return Y


def _run(A, B, scales, zp, bias, K, N, level, block_size):
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=block_size)
    with native.forced_level(level):
        return mm.matmul_nbits_packed(A, packed, bias, accuracy_level=4)[0]


def _case(rng, K, N, M, bs, zp_kind, with_bias):
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, False)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    return rng.standard_normal((M, K)).astype(np.float32), B, scales, zp, bias


_SHAPES = dict(K=st.integers(1, 700), N=st.integers(1, 40), M=st.sampled_from([1, 2, 3, 5, 129]),
               block_size=st.sampled_from([16, 32, 64, 128, 256]), zp_kind=st.sampled_from(["none", "packed"]),
               with_bias=st.booleans(), seed=st.integers(0, 2**16))
needs_native = pytest.mark.skipif(not native.available(), reason="native extension not built")
_SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.skipif(mm.mlas_order() != "avx2", reason="onnxruntime runs MLAS's AVX2 kernels only on such a CPU")
@_SETTINGS
@given(**_SHAPES)
def test_reference_is_onnxruntime_on_an_avx2_cpu(K, N, M, block_size, zp_kind, with_bias, seed):
    A, B, scales, zp, bias = _case(np.random.default_rng(seed), K, N, M, block_size, zp_kind, with_bias)
    want = _ort(A, B, scales, zp, bias, K=K, N=N, bits=4, block_size=block_size, accuracy_level=4)
    got = mlas_avx2_reference(A, B, scales, zp, bias, N=N, block_size=block_size)
    assert np.array_equal(got, want), (int((got != want).sum()), float(np.abs(got - want).max()))


def _force(mp: pytest.MonkeyPatch, order: str) -> None:
    """Force ``order`` for the calls that follow (the order is read once per process, then cached)."""
    mp.setenv(mm.ORDER_ENV, order)
    mm.int8_order.cache_clear()


@pytest.fixture(autouse=True)
def _order_read_afresh():
    """No test leaves its forced order cached for the next one."""
    yield
    mm.int8_order.cache_clear()


@needs_native
@pytest.mark.parametrize("order", ["avx2", "avx2vnni"])
@_SETTINGS
@given(**_SHAPES)
def test_forced_avx2_orders_are_the_reference_at_every_level(monkeypatch, order, K, N, M, block_size, zp_kind,
                                                             with_bias, seed):
    _force(monkeypatch, order)
    A, B, scales, zp, bias = _case(np.random.default_rng(seed), K, N, M, block_size, zp_kind, with_bias)
    want = mlas_avx2_reference(A, B, scales, zp, bias, N=N, block_size=block_size, vnni=order == "avx2vnni")
    for level in native.supported_levels():
        got = _run(A, B, scales, zp, bias, K, N, level, block_size)
        assert np.array_equal(got, want), (level, int((got != want).sum()), float(np.abs(got - want).max()))


@needs_native
@_SETTINGS
@given(**_SHAPES)
def test_forced_avx512_order_is_the_portable_levels_at_every_level(monkeypatch, K, N, M, block_size, zp_kind,
                                                                   with_bias, seed):
    _force(monkeypatch, "avx512")
    A, B, scales, zp, bias = _case(np.random.default_rng(seed), K, N, M, block_size, zp_kind, with_bias)
    want = _run(A, B, scales, zp, bias, K, N, "portable", block_size)
    for level in native.supported_levels():
        np.testing.assert_array_equal(_run(A, B, scales, zp, bias, K, N, level, block_size), want)


@needs_native
def test_orders_differ_and_the_variable_is_checked(monkeypatch):
    """The two orders really are different sums (so the forced order is what runs), and a bad value names
    the variable."""
    A, B, scales, zp, bias = _case(np.random.default_rng(3), 1024, 64, 4, 32, "none", False)
    got = {}
    for order in ("avx512", "avx2"):
        _force(monkeypatch, order)
        got[order] = _run(A, B, scales, zp, bias, 1024, 64, native.dispatch_level(), 32)
    assert not np.array_equal(got["avx512"], got["avx2"])
    np.testing.assert_allclose(got["avx512"], got["avx2"], rtol=1e-5, atol=1e-5)
    _force(monkeypatch, "sse")
    with pytest.raises(KernelError, match=mm.ORDER_ENV):
        mm.int8_order()


@needs_native
@pytest.mark.parametrize(("M", "K", "bs"), [(3, 4100, 32), (6, 3500, 16), (5, 4160, 64), (129, 3100, 32)])
def test_long_k_rows_kernel_slices_keep_the_order(M, K, bs):
    """K past one slice of the several-rows kernels' unpacked weights (16 groups of 64 k without AVX-VNNI, 48
    with it): chains carried
    over slices, trailing blocks after them, the one-row kernel's row beside it (M = 129)."""
    A, B, scales, zp, bias = _case(np.random.default_rng(K), K, 37, M, bs, "packed", True)
    want = mlas_avx2_reference(A, B, scales, zp, bias, N=37, block_size=bs)
    if mm.mlas_order() == "avx2":
        np.testing.assert_array_equal(want, _ort(A, B, scales, zp, bias, K=K, N=37, bits=4, block_size=bs,
                                                 accuracy_level=4))
    with pytest.MonkeyPatch.context() as mp:
        _force(mp, "avx2")
        for level in native.supported_levels():
            np.testing.assert_array_equal(_run(A, B, scales, zp, bias, K, 37, level, bs), want)


@needs_native
@_SETTINGS
@given(K=st.integers(900, 2300), N=st.integers(1, 40), M=st.integers(2, 40),
       block_size=st.sampled_from([16, 32, 64, 128, 256]), zp_kind=st.sampled_from(["none", "packed"]),
       with_bias=st.booleans(), seed=st.integers(0, 2**16))
def test_rows_kernel_tiles_keep_the_order(monkeypatch, K, N, M, block_size, zp_kind, with_bias, seed):
    """The AVX2 several-rows kernel's tiles (4 rows and a remainder of 1-3, both panel halves, one chain at a
    time over slices of 16 groups of 64 k): every chain keeps its order across tiles, slices and row blocks
    of 32, beside the one-row kernel's last row (M % 128 == 1 only at M = 1 here: not that row)."""
    _force(monkeypatch, "avx2")
    A, B, scales, zp, bias = _case(np.random.default_rng(seed), K, N, M, block_size, zp_kind, with_bias)
    want = mlas_avx2_reference(A, B, scales, zp, bias, N=N, block_size=block_size)
    for level in native.supported_levels():
        got = _run(A, B, scales, zp, bias, K, N, level, block_size)
        assert np.array_equal(got, want), (level, int((got != want).sum()), float(np.abs(got - want).max()))


@needs_native
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
@pytest.mark.parametrize("M", [4, 6, 7, 35])
def test_rows_kernel_zero_point_terms_of_row_groups_keep_the_order(M, zp_kind):
    """The several-rows kernel sums the zero-point terms of 4 rows at once, then of the 1-3 rows left in its
    tile of up to 32 (M = 35: tiles of 32 and 3 rows): each row's chain over the blocks stays in order."""
    A, B, scales, zp, bias = _case(np.random.default_rng(M), 200, 37, M, 32, zp_kind, True)
    want = mlas_avx2_reference(A, B, scales, zp, bias, N=37, block_size=32)
    with pytest.MonkeyPatch.context() as mp:
        _force(mp, "avx2")
        for level in native.supported_levels():
            np.testing.assert_array_equal(_run(A, B, scales, zp, bias, 200, 37, level, 32), want)
