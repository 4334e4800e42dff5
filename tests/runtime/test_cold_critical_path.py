"""The first (cold) run's critical path, proven with gates (events the test controls), never sleeps."""

import threading

import numpy as np

from onnx_prepared.prepared import EntryState
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.scheduler import CpuExecutor, RuntimeScheduler
from tests.helpers.models import gemm_mlp, reference_mlp

X = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)


def _key(s: RuntimeSession, source: str):
    (key,) = [r.key for r in s.plan.requirements if r.sources == (source,) and not r.key.is_raw]
    return key


def test_run_waiting_for_a_running_prepack_lends_its_slot_to_the_next_one(tmp_path):
    """W0's prepack holds preparation's only CPU slot (gated) when the run needs it: the slot the waiting
    run leaves prepacks W1, which it needs next. Without that W1 would queue behind W0."""
    path = gemm_mlp(tmp_path, layers=3)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=2)
    packing0, gate0, w1_done = threading.Event(), threading.Event(), threading.Event()
    try:
        with RuntimeSession(path, scheduler=sched) as s:
            w0, w1, w2 = (_key(s, f"W{i}") for i in range(3))
            prepack = s.state.prepack

            def gated(key, generation, entries):
                if key == w0:
                    packing0.set()
                    assert gate0.wait(20)
                prepack(key, generation, entries)

            s.state.prepack = gated
            hp = s.prepare_async()
            assert packing0.wait(20)  # W0's prepack is running on preparation's slot
            h = s.run_async({"x": X})
            sched.when_done(s.store.producer(w1), lambda _t: w1_done.set())
            assert w1_done.wait(20)  # W1 prepacked on the slot the waiting run left ...
            assert s.store.state(w1) is EntryState.RESIDENT
            assert h.is_ready() is False and s.store.state(w0) is not EntryState.RESIDENT
            assert s.store.state(w2) is not EntryState.RESIDENT  # ... and only W1: one ahead
            gate0.set()
            (y,) = h.result(timeout=20)
            hp.wait(timeout=20)
        np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    finally:
        gate0.set()
        sched.close(cancel=True)


def test_run_waiting_for_a_read_promotes_nothing_ahead(tmp_path, gated_reader):
    """Waiting for W0's read (held back), the run promotes no prepack ahead of it: a CPU slot taken
    meanwhile would delay the run once W0 arrives."""
    path = gemm_mlp(tmp_path, layers=2)
    gate0 = threading.Event()
    reader = gated_reader({"W0": gate0})
    with RuntimeSession(path, reader=reader) as s:
        bit0 = [r.key for r in s.plan.requirements].index(_key(s, "W0"))
        ahead, waited = [], threading.Event()
        promote_next, wait_for = s.inference._promote_next, s.inference._wait_for
        s.inference._promote_next = lambda frame, bit: (ahead.append(bit), promote_next(frame, bit))

        def spy_wait(*args):
            resume = wait_for(*args)
            waited.set()
            return resume

        s.inference._wait_for = spy_wait
        h = s.run_async({"x": X})
        assert waited.wait(20)  # the run yielded, waiting for W0's read
        gate0.set()
        (y,) = h.result(timeout=20)
        assert s.counters["yields"] >= 1
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert bit0 not in ahead
