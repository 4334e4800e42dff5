"""The native panel16 transpose of a 4-bit prepack gives numpy's bytes (kernels/_native/prep_panels.c)."""

import numpy as np
import pytest

from onnx_prepared.kernels import _q4_panels as q4
from onnx_prepared.kernels import native
from onnx_prepared.memory import aligned


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize(("K", "N"), [(1024, 64), (40, 48), (96, 16), (2816, 32), (33, 16), (64, 40)])
@pytest.mark.parametrize("zp", [None, "u4", "f32"])
def test_pack_q4_native_equals_numpy(monkeypatch, K, N, zp):
    rng = np.random.default_rng(K * N)
    kb = -(-K // 32)
    B = rng.integers(0, 256, (N, kb, 16), dtype=np.uint8)
    S = rng.random((N, kb), dtype=np.float32)
    Z = {None: None, "u4": rng.integers(0, 256, (N, -(-kb // 2)), dtype=np.uint8),
         "f32": rng.random((N, kb), dtype=np.float32)}[zp]
    fast = q4.pack_q4(B, S, Z, K=K, N=N, block_size=32)
    monkeypatch.setattr(native, "panel16_u32", lambda words, out: False)
    slow = q4.pack_q4(B, S, Z, K=K, N=N, block_size=32)
    np.testing.assert_array_equal(fast.data, slow.data)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_panel16_refuses_mismatched_buffers():
    words = np.zeros((32, 8), np.uint32)
    with pytest.raises(ValueError, match="P \\* 16 \\* kc"):
        native._ext.panel16_u32(words, np.zeros((2, 8, 15), np.uint32), 2, 8)
    out = np.zeros((2, 8, 16), np.uint32)
    words = np.random.default_rng(0).integers(0, 2**32, (32, 8), dtype=np.uint32)
    assert native.panel16_u32(words, out)
    want = q4.interleave_nibbles(words).reshape(2, 16, 8).transpose(0, 2, 1)
    np.testing.assert_array_equal(out, want)
    # the interleave: byte i of a word holds k values i (low nibble) and i + 4 (high nibble)
    assert q4.interleave_nibbles(np.array([0x76543210], np.uint32))[0] == 0x73625140


@pytest.mark.parametrize(("K", "N"), [(1024, 64), (40, 48), (2816, 1024)])
def test_packed_weights_and_pack_scratch_start_on_a_cache_line(K, N):
    """64-byte loads of weight chunks never straddle two lines (numpy's large buffers start 16 bytes into
    a page)."""
    from onnx_prepared.kernels import matmul_nbits as mm

    rng = np.random.default_rng(1)
    kb = -(-K // 32)
    B = rng.integers(0, 256, (N, kb, 16), dtype=np.uint8)
    S = rng.random((N, kb), dtype=np.float32)
    p = q4.pack_q4(B, S, None, K=K, N=N, block_size=32)
    assert p.data.ctypes.data % aligned.ALIGN == 0 and p.data.nbytes == sum(q4.section_sizes(K, N, 32, q4.ZP_NONE))
    assert p.data.flags.c_contiguous and p.data.dtype == np.uint8
    assert mm.thread_scratch(p.data.nbytes + 1000).ctypes.data % aligned.ALIGN == 0
    for n in (1, 63, 64, 1 << 20):
        assert aligned.aligned_empty(n).ctypes.data % aligned.ALIGN == 0 and aligned.aligned_empty(n).nbytes == n
