"""The prepacked SGEMM (sgemm.c) under Conv: the panel layout, every dispatch level against numpy, the
same values for every thread count, the epilogue (bias, clip), and Conv models with constant weights
(prepacked) against onnxruntime at every level, first run and later runs, over hypothesis' shapes."""

from __future__ import annotations

import os
import tempfile
import threading
import time

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_prepared.kernels import native
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path
from tests.helpers.models import conv_node_model

RNG = np.random.default_rng(13)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def test_pack_panels_layout_round_trips():
    wm = RNG.standard_normal((2, 37, 11)).astype(np.float32)
    packed = native.pack_panels(wm)
    assert packed.shape == (2, 3, 11, 16) and packed.flags.c_contiguous
    np.testing.assert_array_equal(packed[1, 2, 4, :5], wm[1, 32:, 4])
    assert not packed[:, 2, :, 5:].any()  # rows past M are zero
    np.testing.assert_array_equal(native.unpack_panels(packed, 37), wm)


SHAPES = [(1, 64, 147, 300, 1), (1, 300, 200, 40, 2), (2, 8, 9, 70, 3), (1, 5, 7, 3, 1), (1, 512, 600, 8, 1),
          (3, 33, 17, 25, 2), (1, 48, 1, 13, 1)]


@pytest.mark.parametrize(("g", "m", "k", "n", "b"), SHAPES)
def test_sgemm_packed_matches_numpy(path, g, m, k, n, b):
    a = RNG.standard_normal((g, m, k)).astype(np.float32)
    x = RNG.standard_normal((b, g, k, n)).astype(np.float32)
    bias = RNG.standard_normal(g * m).astype(np.float32)
    ref = np.matmul(a.astype(np.float64), x) + bias.reshape(g, m, 1)
    y = native.sgemm_packed(native.pack_panels(a), m, x, bias)
    assert y.shape == (b, g, m, n) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(native.sgemm_packed(native.pack_panels(a), m, x, None, 0.0, 6.0),
                               np.clip(ref - bias.reshape(g, m, 1), 0, 6), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize("level", native.supported_levels())
def test_sgemm_packed_is_thread_count_independent(level):
    a = RNG.standard_normal((1, 200, 900)).astype(np.float32)
    x = RNG.standard_normal((2, 1, 900, 130)).astype(np.float32)
    packed, before = native.pack_panels(a), native.get_num_threads()
    try:
        with native.forced_level(level):
            outs = []
            for t in (1, 2, 3):
                native.set_num_threads(t)
                outs.append(native.sgemm_packed(packed, 200, x))
    finally:
        native.set_num_threads(before)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])


@pytest.mark.skipif("avx512vnni" not in native.supported_levels(), reason="no AVX-512")
@pytest.mark.parametrize("n", [32, 45, 300])
@pytest.mark.parametrize(("lo", "hi", "act"), [(-np.inf, np.inf, 0), (0.0, 6.0, 0), (-np.inf, np.inf, 1)])
def test_avx512_column_task_equals_the_row_task(n, lo, hi, act):
    """From SG_NCOLS_MIN columns on (K <= SG_NCOLS_MAXK), AVX-512 runs the column-vectorised task
    (sg_ntask_avx512): the same k-order FMA chains and epilogue as the row-vectorised task, so the same
    bits as computing the columns in blocks of 8 (which take the row task)."""
    a = RNG.standard_normal((2, 37, 29)).astype(np.float32)
    x = RNG.standard_normal((1, 2, 29, n)).astype(np.float32) * 3
    bias = RNG.standard_normal(74).astype(np.float32)
    packed = native.pack_panels(a)
    with native.forced_level("avx512vnni"):
        y = native.sgemm_packed(packed, 37, x, bias, lo, hi, act)
        parts = [native.sgemm_packed(packed, 37, np.ascontiguousarray(x[..., c:c + 8]), bias, lo, hi, act)
                 for c in range(0, n, 8)]
    np.testing.assert_array_equal(y, np.concatenate(parts, axis=-1))


@pytest.mark.skipif("avx2" not in native.supported_levels(), reason="no AVX2")
@pytest.mark.parametrize("n", [1, 4, 16, 13])
@pytest.mark.parametrize(("lo", "hi", "act", "alpha"), [(-np.inf, np.inf, 0, 0.0), (0.0, 6.0, 0, 0.0),
                                                         (-1.0, np.inf, 1, 0.0), (-np.inf, np.inf, 2, 0.1)])
def test_row_task_epilogue_is_the_same_at_every_fma_level(n, lo, hi, act, alpha):
    """The AVX-512 row task applies the epilogue to its accumulators, the AVX2 one to the stored tile: the
    same bits (a partial last panel pair, biased, in even-width column tiles), and numpy's values."""
    a = RNG.standard_normal((1, 40, 160)).astype(np.float32)
    x = RNG.standard_normal((1, 1, 160, n)).astype(np.float32)
    bias = RNG.standard_normal(40).astype(np.float32)
    packed = native.pack_panels(a)
    outs = []
    for level in [lv for lv in native.supported_levels() if lv != "portable"]:
        with native.forced_level(level):
            outs.append(native.sgemm_packed(packed, 40, x, bias, lo, hi, act, alpha))
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    ref = np.clip((a[0].astype(np.float64) @ x[0, 0]) + bias[:, None], lo, hi)
    ref = ref * np.clip(ref / 6 + 0.5, 0, 1) if act == 1 else np.where(ref < 0, alpha * ref, ref) if act == 2 else ref
    np.testing.assert_allclose(outs[0].reshape(40, n), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_sgemm_packed_rejects_short_buffers():
    with pytest.raises(ValueError, match="smaller than its shape"):
        native._ext.sgemm_packed(np.zeros(16, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32), None,
                                 np.array([1, 2, 2, 2, 1], np.int64), 0.0, 1.0, 0)


def _conv_model(xs, ws, attrs, bias):
    return conv_node_model("Conv", RNG, xs, ws, attrs, bias)


def _check_model(model, xs, n_runs: int = 2):
    import onnxruntime as ort

    x = RNG.standard_normal(xs).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = ref.run(None, {"x": x})
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, os.path.join(d, "conv.onnx"))
        _run_ours(os.path.join(d, "conv.onnx"), x, expected, n_runs)


def _run_ours(path: str, x, expected, n_runs: int):
    with RuntimeSession(path) as s:
        assert any(c.startswith("prepacked:conv-w-p16") for c in s.resolved.kernel_choices)
        for _ in range(n_runs):  # first (cold) run, then the prepared one
            (y,) = s.run({"x": x})
            np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("xs", "ws", "attrs"), [
    ((2, 512, 2, 2), (64, 512, 3, 3), {"pads": [1, 1, 1, 1]}),  # late ResNet layer: batch joins the columns
    ((1, 3, 33, 31), (24, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 40, 7, 7), (120, 40, 1, 1), {}),  # pointwise
    ((2, 8, 6, 6), (12, 4, 3, 3), {"group": 2, "strides": [2, 2], "dilations": [1, 2]}),
    ((1, 6, 9), (6, 3, 3), {"group": 2, "pads": [1, 2]}),  # 1-D
    ((1, 4, 5, 6, 7), (18, 4, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),  # 3-D
])
def test_prepacked_conv_models_match_onnxruntime(path, xs, ws, attrs):
    _check_model(_conv_model(xs, ws, attrs, bias=True), xs)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(nd=st.integers(1, 3), n=st.integers(1, 2), cg=st.integers(2, 5), g=st.integers(1, 3), mg=st.integers(1, 40),
       k=st.integers(1, 3), s=st.integers(1, 2), d=st.integers(1, 2), p=st.integers(0, 2), extra=st.integers(0, 5),
       bias=st.booleans(), level=st.sampled_from(native.supported_levels() or ("numpy",)))
def test_prepacked_conv_hypothesis(nd, n, cg, g, mg, k, s, d, p, extra, bias, level):
    size = d * (k - 1) + 1 + extra
    xs, ws = (n, cg * g, *([size] * nd)), (mg * g, cg, *([k] * nd))
    attrs = {"group": g, "strides": [s] * nd, "dilations": [d] * nd, "pads": [p] * nd + [max(0, p - 1)] * nd}
    model = _conv_model(xs, ws, attrs, bias)
    if level == "numpy":
        _check_model(model, xs)
    else:
        with native.forced_level(level):
            _check_model(model, xs)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize(("xs", "k", "group", "attrs"), [
    ((2, 6, 7, 9), (3, 2), 2, {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ((3, 4, 5, 5), (3, 3), 1, {"pads": [4, 4, 4, 4]}),  # pads wider than the kernel
    ((1, 4, 11), (3,), 2, {"strides": [3], "pads": [2, 1], "dilations": [2]}),  # 1-D
])
@pytest.mark.parametrize("merge", [False, True])
def test_im2col_matches_the_window_view(xs, k, group, attrs, merge):
    from onnx_prepared.kernels import _spatial as sp

    x = RNG.standard_normal(xs).astype(np.float32)
    nd = len(k)
    strides, dil = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd)
    begins, ends, out = sp.geometry("Conv", xs[2:], k, auto_pad="NOTSET", pads=attrs["pads"], strides=strides,
                                    dilations=dil)
    win = sp.windows(sp.pad_input(x, begins, ends, out, k, strides, dil, 0), out, k, strides, dil)
    n, p = xs[0], int(np.prod(out))
    ref = win.transpose(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd)).reshape(n, group, -1, p)
    if merge:
        ref = ref.transpose(1, 2, 0, 3).reshape(1, group, -1, n * p)
    np.testing.assert_array_equal(native.im2col2d(x, group, k, out, begins, strides, dil, merge), ref)


@pytest.mark.skipif(len(native.supported_levels()) < 2, reason="one dispatch level only")
def test_isa_env_selects_the_sgemm_level():
    """ONNX_PREPARED_ISA forces the packed SGEMM's level too: a child at the lowest level computes
    exactly what forced_level gives here (the levels differ in rounding: FMA, summation order)."""
    import subprocess
    import sys

    level = native.supported_levels()[0]
    a = RNG.standard_normal((1, 40, 50)).astype(np.float32)
    x = RNG.standard_normal((1, 1, 50, 30)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "a.npy"), a)
        np.save(os.path.join(d, "x.npy"), x)
        code = ("import numpy as np, os, sys; from onnx_prepared.kernels import native; d = sys.argv[1]; "
                "y = native.sgemm_packed(native.pack_panels(np.load(d + '/a.npy')), 40, np.load(d + '/x.npy')); "
                "np.save(d + '/y.npy', y)")
        subprocess.run([sys.executable, "-c", code, d], env={**os.environ, native.ISA_ENV: level}, check=True)
        child = np.load(os.path.join(d, "y.npy"))
    with native.forced_level(level):
        here = native.sgemm_packed(native.pack_panels(a), 40, x)
    np.testing.assert_array_equal(child, here)


@pytest.mark.skipif("avx512vnni" not in native.supported_levels(), reason="needs AVX-512")
@pytest.mark.parametrize("seed", range(4))
def test_conv_implicit_gives_im2col_sgemm_bits(seed):
    """``conv_implicit`` (the AVX-512 tile reading a zero-padded image at each k's offset) against im2col2d
    + sgemm_packed on random one-group geometries (kernels 1-7, strides, dilations, pads, the epilogue),
    bit for bit, on 1 and 2 threads; below AVX-512 it declines (False)."""
    from onnx_prepared.kernels import _spatial as sp

    ext, rng, before = native._ext, np.random.default_rng(seed), native.get_num_threads()
    done = 0
    try:
        with native.forced_level("avx512vnni"):
            while done < 12:
                n, c, m = int(rng.integers(1, 3)), int(rng.integers(1, 24)), int(rng.integers(1, 70))
                kh, kw = int(rng.integers(1, 8)), int(rng.integers(1, 8))
                h, w = int(rng.integers(kh, 30)), int(rng.integers(kw, 40))
                strides, dilations = [int(rng.integers(1, 4)), int(rng.integers(1, 3))], [int(v) for v in
                                                                                        rng.integers(1, 3, 2)]
                pads = [int(v) for v in rng.integers(0, 4, 4)]
                if any((k - 1) * d + 1 > s + p0 + p1 for k, d, s, p0, p1 in
                       zip((kh, kw), dilations, (h, w), pads[:2], pads[2:])):
                    continue  # a window larger than the padded input
                begins, _, out = sp.geometry("Conv", (h, w), (kh, kw), auto_pad="NOTSET", pads=pads,
                                             strides=strides, dilations=dilations)
                x = rng.standard_normal((n, c, h, w), dtype=np.float32)
                packed = native.pack_panels(rng.standard_normal((1, m, c * kh * kw), dtype=np.float32))
                b = rng.standard_normal(m, dtype=np.float32) if done % 3 else None
                lo, hi, act = (0.0, 6.0, 0) if done % 2 else (-np.inf, np.inf, int(rng.integers(0, 3)))
                k, p = c * kh * kw, out[0] * out[1]
                cols = np.empty((n, 1, k, p), np.float32)
                ext.im2col2d(x, cols, np.array([n, c, h, w, 1, kh, kw, *out, *begins, *strides, *dilations, 0],
                                               np.int64))
                want = np.empty((n, m, *out), np.float32)
                ext.sgemm_packed(packed, cols, want, b, np.array([1, m, k, p, n], np.int64), lo, hi, act, 0.1)
                dims = np.array([n, c, h, w, m, kh, kw, *out, *begins, *strides, *dilations], np.int64)
                for t in (1, 2):
                    native.set_num_threads(t)
                    got = np.empty_like(want)
                    assert ext.conv_implicit(x, packed, b, got, dims, lo, hi, act, 0.1)
                    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
                done += 1
        with native.forced_level("avx2"):
            assert not ext.conv_implicit(x, packed, b, got, dims, lo, hi, act, 0.1)
    finally:
        native.set_num_threads(before)


@pytest.mark.skipif("avx512vnni" not in native.supported_levels(), reason="needs AVX-512")
def test_conv_implicit_reuses_its_padded_copies_with_new_images():
    """``conv_implicit`` keeps one padded copy per geometry (the last 8) and writes only the image into a
    copy it had: ten geometries in turn, twice, each call with a new image, and one past the kept size
    (1 << 20 floats), give im2col2d + sgemm_packed's bits every time."""
    from onnx_prepared.kernels import _spatial as sp

    ext, rng = native._ext, np.random.default_rng(5)
    geoms = [(2, 3 + i, 9 + i, 8 + 2 * i, 1 + i % 2, i % 3) for i in range(10)] + [(1, 64, 130, 130, 1, 1)]
    with native.forced_level("avx512vnni"):
        for _ in range(2):
            for n, c, h, w, s, p in geoms:
                begins, _, out = sp.geometry("Conv", (h, w), (3, 3), auto_pad="NOTSET", pads=[p] * 4,
                                             strides=[s, s], dilations=[1, 1])
                m, k, q = 24, c * 9, out[0] * out[1]
                x = rng.standard_normal((n, c, h, w), dtype=np.float32)
                packed = native.pack_panels(rng.standard_normal((1, m, k), dtype=np.float32))
                cols = np.empty((n, 1, k, q), np.float32)
                ext.im2col2d(x, cols, np.array([n, c, h, w, 1, 3, 3, *out, *begins, s, s, 1, 1, 0], np.int64))
                want = np.empty((n, m, *out), np.float32)
                ext.sgemm_packed(packed, cols, want, None, np.array([1, m, k, q, n], np.int64), -np.inf, np.inf, 0)
                got = np.empty_like(want)
                dims = np.array([n, c, h, w, m, 3, 3, *out, *begins, s, s, 1, 1], np.int64)
                assert ext.conv_implicit(x, packed, None, got, dims, -np.inf, np.inf, 0)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.skipif(not native.available() or "avx512vnni" not in native.supported_levels(),
                    reason="conv_implicit runs at the avx512vnni level")
def test_a_threads_padded_copies_are_freed_when_it_exits():
    """Kernels keep per-thread scratch (conv_implicit's padded copies among them) for the next call on
    that thread; a thread that ends (a session with its own scheduler ends its workers at close) frees
    its scratch: the bytes every thread holds come back to what they were once it has exited."""
    from onnx_prepared.kernels import _spatial as sp

    ext, rng = native._ext, np.random.default_rng(7)
    n, c, h, w, m = 1, 16, 40, 40, 24
    begins, _, out = sp.geometry("Conv", (h, w), (3, 3), auto_pad="NOTSET", pads=[1] * 4, strides=[1, 1],
                                 dilations=[1, 1])
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    packed = native.pack_panels(rng.standard_normal((1, m, c * 9), dtype=np.float32))
    dims = np.array([n, c, h, w, m, 3, 3, *out, *begins, 1, 1, 1, 1], np.int64)
    before, held = ext.thread_scratch_bytes(), []

    def conv() -> None:
        y = np.empty((n, m, *out), np.float32)
        assert ext.conv_implicit(x, packed, None, y, dims, -np.inf, np.inf, 0)
        held.append(ext.thread_scratch_bytes())

    with native.forced_level("avx512vnni"):
        t = threading.Thread(target=conv)
        t.start()
        t.join()
    assert held and held[0] >= before + 4 * c * (h + 2) * (w + 2)  # its padded copy, at least
    deadline = time.monotonic() + 30  # the OS thread frees it as it exits, after join() returned
    while ext.thread_scratch_bytes() != before and time.monotonic() < deadline:
        time.sleep(0.005)
    assert ext.thread_scratch_bytes() == before
