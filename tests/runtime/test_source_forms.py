"""Source forms: a cold run computes a 4-bit MatMulNBits from its source bytes (packed a few panels per
pool task by the native source kernel, or, without it, into a reused per-thread scratch) while its
prepared object is not resident, instead of waiting for its prepack.
Structure is proven with gates (prepacks held until the test lets them go), never sleeps; outputs are
compared bit for bit with the prepared path."""

import threading

import numpy as np
import pytest

from onnx_prepared.kernels import matmul_nbits as mnb
from onnx_prepared.kernels import native
from onnx_prepared.prepared import EntryState
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime.inference import SOURCE_FORMS_ENV

SMALL = dict(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512, block_size=16,
             context_length=64)


@pytest.fixture(scope="module", params=[None, "fp32"], ids=["tied", "fp32-embedding"])
def model(request, tmp_path_factory):
    from onnx_prepared.generate import generate_tiny_llm
    from onnx_prepared.generate.config import TinyLlmConfig
    from onnx_prepared.generate.feeds import prefill_feeds

    cfg = dict(SMALL, embedding=request.param) if request.param else SMALL
    path = generate_tiny_llm(tmp_path_factory.mktemp("m") / "m", **cfg)
    return path, prefill_feeds(TinyLlmConfig.from_preset(None, **cfg), [5, 1, 7, 3, 2, 9])


def _prepared_outputs(path, feeds) -> list:
    with RuntimeSession(path) as s:
        s.prepare()
        return s.run(feeds)


def test_first_run_computes_from_source_forms_before_any_prepack(model, monkeypatch):
    """Every MatMulNBits prepack is held back by a gate: the first run still completes, from its source
    reads alone (through the native source kernel when there is one), with the prepared path's bits;
    released, the prepacks publish and a later (hot) run gives the same bits again."""
    path, feeds = model
    want = _prepared_outputs(path, feeds)
    source_calls = []
    kernel = native.matmul_q4_source
    monkeypatch.setattr(native, "matmul_q4_source", lambda *a, **k: (source_calls.append(1), kernel(*a, **k))[1])
    gate, packed = threading.Event(), []
    with RuntimeSession(path) as s:
        forms = {s.plan.requirements[b].key for b in s.inference._transient}
        assert forms and all(k.layout.startswith("matmul-nbits-q4-panel16") for k in forms)
        prepack = s.state.prepack

        def gated(key, generation, entries):
            assert gate.wait(20)
            packed.append(key)
            prepack(key, generation, entries)

        s.state.prepack = gated
        try:
            first = s.run_async(feeds).result(timeout=20)
            assert packed == []  # no prepack ran before the first output
            assert len(source_calls) == (len(forms) if native.available() else 0)
            assert all(s.store.state(k) is not EntryState.RESIDENT for k in forms)
        finally:
            gate.set()
        s.prepare()
        assert set(packed) == forms
        assert s.inference.counters["cold_runs"] == 1
        hot = s.run(feeds)
        assert s.inference.counters["hot_runs"] >= 1
    for a, b, c in zip(want, first, hot, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_a_later_cold_run_waits_for_the_prepacks_in_flight(model, monkeypatch):
    """Once the first run has ended its held-back prepacks run; a cold run then waits for them (promoted)
    instead of taking source forms, which would pack the same weights again in each of its calls (the
    decode steps right after a cold prefill did, step after step). Gates: the prepacks wait for ``gate``;
    the second run is seen waiting for a producer before the gate opens."""
    path, feeds = model
    want = _prepared_outputs(path, feeds)
    source_calls = []
    kernel = native.matmul_q4_source
    monkeypatch.setattr(native, "matmul_q4_source", lambda *a, **k: (source_calls.append(1), kernel(*a, **k))[1])
    gate, waiting = threading.Event(), threading.Event()
    with RuntimeSession(path) as s:
        prepack = s.state.prepack

        def gated(key, generation, entries):
            assert gate.wait(20)
            prepack(key, generation, entries)

        s.state.prepack = gated
        wait_for = s.inference._wait_for

        def seen_waiting(*args):
            waiting.set()
            return wait_for(*args)

        s.inference._wait_for = seen_waiting
        try:
            first = s.run(feeds)  # from source forms; its prepacks start at its end and wait at the gate
            calls = len(source_calls)
            h = s.run_async(feeds)
            assert waiting.wait(20)
            assert len(source_calls) == calls  # not one source form in the second run
        finally:
            gate.set()
        second = h.result(timeout=20)
        assert len(source_calls) == calls and s.inference.counters["cold_runs"] == 2
    for a, b, c in zip(want, first, second, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_a_prepack_published_mid_run_is_taken_from_the_next_segment(model):
    """The runtime chooses by residency, per segment: an object published while the run computes is
    pinned from the next range that reads it (here: all of them resident before the run but one)."""
    path, feeds = model
    want = _prepared_outputs(path, feeds)
    with RuntimeSession(path) as s:
        bits = sorted(s.inference._transient)
        s.prepare()
        keep = s.plan.requirements[bits[0]].key
        for b in bits[1:]:
            s.store.evict(s.plan.requirements[b].key)
        assert s.store.state(keep) is EntryState.RESIDENT
        got = s.run(feeds)
        assert s.inference.counters["cold_runs"] == 1
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)


def test_source_forms_off_waits_for_the_prepacks(model, monkeypatch):
    """``$ONNX_PREPARED_SOURCE_FORMS=0``: no source form, the first run waits for its prepacks."""
    path, feeds = model
    monkeypatch.setenv(SOURCE_FORMS_ENV, "0")
    with RuntimeSession(path) as s:
        assert s.inference._transient == {}
        prepack, packed = s.state.prepack, []
        s.state.prepack = lambda key, gen, entries: (packed.append(key), prepack(key, gen, entries))
        s.run(feeds)
        assert packed  # the run waited for (at least) the prepacks it read


@pytest.mark.parametrize(("chunk", "native_source"), [(None, True), (None, False), (1 << 12, False)],
                         ids=["native", "one-chunk", "column-chunks"])
def test_source_kernel_gives_the_prepacked_bits(monkeypatch, chunk, native_source):
    """matmul_nbits_source (the unprepacked kernel and the source form) runs the native source kernel, or
    without it packs into this thread's reused scratch, in column chunks when N is large: after larger and
    smaller packs in it, every call gives the prepacked kernel's bits (zero points none, uint8, float;
    bias; N not a multiple of 16; level 0 and 4)."""
    if chunk is not None:
        monkeypatch.setattr(mnb, "SOURCE_CHUNK_BYTES", chunk)  # 4 KB: 16-32 columns a chunk here
    if not native_source:
        monkeypatch.setattr(native, "matmul_q4_source", lambda *a, **k: None)  # as without the extension
    rng = np.random.default_rng(0)
    cases = []
    for K, N, zp in ((256, 96, None), (64, 32, "u8"), (128, 40, "f32"), (256, 100, "u8")):
        kb = K // 32
        B = rng.integers(0, 256, (N, kb, 16), dtype=np.uint8)
        scales = rng.random((N, kb), dtype=np.float32) + 0.1
        zps = {None: None, "u8": rng.integers(0, 256, (N, (kb + 1) // 2), dtype=np.uint8),
               "f32": rng.random((N, kb), dtype=np.float32) * 15}[zp]
        bias = rng.standard_normal(N).astype(np.float32) if N % 3 == 0 else None
        cases.append((rng.standard_normal((2, 5, K)).astype(np.float32), B, scales, zps, bias, K, N))
    for level in (0, 4):
        for A, B, scales, zps, bias, K, N in cases:
            packed = mnb.prepack_matmul_nbits(B, scales, zps, K=K, N=N, block_size=32)
            (want,) = mnb.matmul_nbits_packed(A, packed, bias, accuracy_level=level)
            (got,) = mnb.matmul_nbits_source(A, B, scales, zps, bias, K=K, N=N, block_size=32, accuracy_level=level)
            assert got.shape == want.shape == (2, 5, N) and np.array_equal(want, got)
            inputs = (A, B, scales, zps, None, bias)
            (unpacked,) = mnb.matmul_nbits(*inputs, K=K, N=N, block_size=32, accuracy_level=level)
            assert np.array_equal(want, unpacked)
