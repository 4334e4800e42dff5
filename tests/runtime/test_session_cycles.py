"""A session holds no reference cycle: dropping it frees it by reference counting (see the callbacks in
runtime/producers.py ``weakly`` and runtime/inference.py ``_outputs_dropped``)."""

import numpy as np
import pytest

from tests.helpers.models import gemm_mlp

X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


@pytest.mark.parametrize("budget", [None, 1 << 20])
def test_a_dropped_session_is_freed_without_the_cyclic_collector(tmp_path, budget):
    """Nothing a session builds refers back to itself (the budget's and the outputs' callbacks hold their
    objects weakly): dropping it frees it by reference counting, so no cyclic collection lands in a later
    construction (it was ~0.4 ms each, more in older generations) and its memory is not held until one."""
    import gc
    import weakref

    import onnx_prepared

    path = gemm_mlp(tmp_path, layers=2)
    opts = onnx_prepared.SessionOptions()
    if budget is not None:  # a residency budget: the eviction callbacks are live
        opts.prepared_memory_limit = budget
    gc.collect()
    paused = gc.isenabled()
    gc.disable()
    try:
        s = onnx_prepared.InferenceSession(path, opts)
        (y,) = s.run(None, {"x": X})
        s.run(None, {"x": X})
        rt = s.runtime
        refs = [weakref.ref(o) for o in (rt, rt.inference, rt.producers, rt.producers.residency, rt.state, rt.store)]
        del rt
        s.close()
        del s
        assert [r() is None for r in refs] == [True] * len(refs)
        del y  # the output's weak-reference callback outlives the session harmlessly
    finally:
        if paused:
            gc.enable()


@pytest.mark.parametrize("option", [{"memory_limit": 1 << 30}, {"io_workers": 2}])
def test_a_session_with_its_own_scheduler_ends_every_thread_at_close(tmp_path, option):
    """A session that builds its own scheduler (a memory limit, a trace, another I/O worker count) owns
    its I/O workers and the CPU executor built for it: close() joins both, so creating and closing such
    sessions does not accumulate threads (each used to leave its two CPU workers behind)."""
    import threading

    from onnx_prepared.runtime import RuntimeSession

    path = gemm_mlp(tmp_path, layers=2)
    before = set(threading.enumerate())
    for _ in range(3):
        s = RuntimeSession(path, option)
        assert s.parts.owns_scheduler
        s.run({"x": X})
        s.close()
    assert set(threading.enumerate()) - before == set()
