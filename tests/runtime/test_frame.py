"""ExecutionFrame and the hot path: one kernel-call loop, a short hot path, tracing wrapped from outside."""

import inspect
import pathlib
import re

import numpy as np
import pytest

import onnx_prepared
from onnx_prepared.runtime import ExecutionFrame, RuntimeSession
from onnx_prepared.runtime.inference import Inference
from tests.helpers.models import gemm_mlp

X = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)


def test_the_kernel_call_loop_exists_once():
    """Only ExecutionPlan's step builder reads a bound kernel's call; every path replays through it."""
    root = pathlib.Path(onnx_prepared.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if re.search(r"\.kernel\.call\b", p.read_text()))
    assert callers == ["bind/execution_plan.py"]


def test_hot_path_fits_on_one_screen():
    for fn in (Inference.run, Inference._run_hot, Inference._enter_hot, Inference._replay_hot):
        lines = inspect.getsource(fn).strip().splitlines()
        assert len(lines) <= 30, (fn.__name__, len(lines))


def test_trace_actions_reports_every_action_of_cold_and_hot_runs_without_changing_results(tmp_path):
    with RuntimeSession(gemm_mlp(tmp_path, layers=3)) as s:
        n = len(s.plan.execution.actions)
        seen: list[int] = []
        with s.trace_actions(seen.append):
            (cold,) = s.run({"x": X})
            assert s.counters["cold_runs"] == 1 and seen == list(range(n))
            s.prepare()
            (hot,) = s.run({"x": X})
            assert s.counters["hot_runs"] == 1 and seen == list(range(n)) * 2
        (untraced,) = s.run({"x": X})
        assert seen == list(range(n)) * 2  # the block ended: the plan is the untraced one again
        assert s.inference.execution is s.plan.execution
    np.testing.assert_array_equal(cold, hot)
    np.testing.assert_array_equal(hot, untraced)


def test_frame_steps_measure_live_activations_and_both_paths_reserve_the_peak(tmp_path):
    with RuntimeSession(gemm_mlp(tmp_path, layers=2)) as s:
        s.prepare()
        ex = s.plan.execution
        arena = s.arenas.execution
        values, _ = s._feeds.bind({"x": X})
        for r, slot in zip(s.plan.requirements, s.plan.requirement_slots):
            values[slot] = s.store.get(r.key)
        produced = {s for a in ex.actions for s in a.outputs}
        stepped = ExecutionFrame(1, list(values), arena)
        while stepped.pc < len(ex.actions):
            stepped.step(ex)
            truth = sum(v.nbytes for s, v in enumerate(stepped.values) if s in produced and v is not None)
            assert stepped.live_bytes == sum(stepped.sizes.values()) == truth
            # the arena holds the run's high-water mark, one reservation grown as the peak is measured
            assert arena.live == stepped.reserved_bytes == stepped.peak_bytes >= stepped.live_bytes
            assert sum(a.nbytes for a in stepped.reservation) == arena.live
        assert stepped.peak_bytes > 0 and stepped.pc == len(ex.actions)
        stepped.release_allocations()
        assert arena.live == 0
        before = arena.allocations
        replayed = ExecutionFrame(2, list(values), arena)
        replayed.replay(ex, stepped.peak_bytes)
        assert arena.allocations == before + 1 and arena.live == 0
        out = ex.output_slots[0]
        np.testing.assert_array_equal(stepped.values[out], replayed.values[out])


def test_openblas_is_set_once_not_per_run(tmp_path, monkeypatch):
    """BLAS's thread count is process-wide and fixed (kernels.threads): runs never flip it; it is set
    when a run first needs a different count and then left alone."""
    from onnx_prepared.kernels import _blas

    calls: list[int] = []
    monkeypatch.setattr(_blas, "_api", (lambda: 1, calls.append))
    monkeypatch.setattr(_blas, "_current", None)
    with RuntimeSession(gemm_mlp(tmp_path, layers=2), {"blas_threads": 1}) as s:
        s.run({"x": X})  # cold
        s.prepare()
        for _ in range(5):
            s.run({"x": X})  # hot, on this thread
            s.run_async({"x": X}).result()  # hot, on a CPU worker
        assert s.counters["hot_runs"] == 10
    assert calls == [1]


def _counting_submits(monkeypatch, s):
    submitted: list = []
    submit = s.scheduler.submit

    def counted(tasks, **kw):
        submitted.append(tasks)
        return submit(tasks, **kw)

    monkeypatch.setattr(s.scheduler, "submit", counted)
    return submitted


def test_a_hot_run_submits_no_scheduler_task(tmp_path, monkeypatch):
    """``run`` replays a hot run on the calling thread with no task; ``run_async`` does too once the
    last hot replay was shorter than a hand-off, and hands a longer (or not yet measured) one to a CPU
    worker as one task. Either way the handle is terminal when it should be and callbacks fire once."""
    from onnx_prepared.runtime import inference

    with RuntimeSession(gemm_mlp(tmp_path, layers=2)) as s:
        s.prepare()
        expected = s.run({"x": X})[0]
        submitted = _counting_submits(monkeypatch, s)
        run_here = s.scheduler.run_here
        inline: list = []
        monkeypatch.setattr(s.scheduler, "run_here", lambda fn, **kw: inline.append(kw) or run_here(fn, **kw))
        for _ in range(3):
            np.testing.assert_array_equal(s.run({"x": X})[0], expected)
        assert submitted == [] and inline == [] and s.counters["hot_runs"] == 4  # run builds no handle either
        s.inference.hot_seconds = float("inf")  # not measured (or long): handed off
        h = s.run_async({"x": X})
        np.testing.assert_array_equal(h.result()[0], expected)
        assert len(submitted) == 1 and submitted[0].resource == "cpu"
        monkeypatch.setattr(inference, "HANDOFF_SECONDS", float("inf"))  # every replay is "short"
        fired = []
        h = s.run_async({"x": X})
        assert h.done()  # returned completed
        h.add_done_callback(fired.append)
        np.testing.assert_array_equal(h.result()[0], expected)
        assert len(submitted) == 1 and fired == [h] and s.store.leases == 0


def test_a_failing_hot_run_raises_from_its_handle_and_releases_its_lease(tmp_path, monkeypatch):
    from onnx_prepared.errors import KernelError

    with RuntimeSession(gemm_mlp(tmp_path, layers=2)) as s:
        s.prepare()
        s.run({"x": X})
        act = s.plan.execution.actions[0]

        def broken(*args):
            raise ValueError("kernel broke")

        monkeypatch.setattr(s.inference, "execution", s.plan.execution.traced(lambda i: None))
        steps = list(s.inference.execution.steps)
        steps[0] = (broken, *steps[0][1:])
        object.__setattr__(s.inference.execution, "steps", tuple(steps))
        with pytest.raises(KernelError, match="kernel broke") as e:
            s.run({"x": X})
        assert act.kernel.name in str(e.value)
        assert s.store.leases == 0 and s.arenas.execution.live == 0


def test_a_hot_run_charges_its_peak_while_it_runs_and_its_outputs_until_they_are_dropped(tmp_path, monkeypatch):
    """The frameless hot run (Arena.hold/unhold) keeps the ledger the frame path keeps: the measured
    activation peak is live in the ExecutionArena while kernels run and returned after, the outputs'
    bytes are live in the IOArena until the caller drops them, and a limit the peak would pass raises
    ArenaLimitError naming the run, with the lease released."""
    from onnx_prepared.memory import ArenaLimitError

    with RuntimeSession(gemm_mlp(tmp_path, layers=2)) as s:
        s.prepare()
        s.run({"x": X})  # the first hot run measures the peak through the frame
        peak = s.state.execution_peak
        ex_arena, io = s.arenas.execution, s.arenas.io
        assert peak > 0 and ex_arena.live == 0 and io.live == 0
        seen: list[int] = []
        steps = list(s.plan.execution.steps)
        call = steps[0][0]
        steps[0] = (lambda *a: seen.append(ex_arena.live) or call(*a), *steps[0][1:])
        monkeypatch.setattr(s.inference, "execution", s.plan.execution.traced(lambda i: None))
        object.__setattr__(s.inference.execution, "steps", tuple(steps))
        (y,) = s.run({"x": X})
        assert seen == [peak] and ex_arena.live == 0 and io.live == y.nbytes and s.store.leases == 0
        del y
        assert io.live == 0
        ex_arena.limit = peak - 1
        with pytest.raises(ArenaLimitError, match=r"ExecutionArena: \d+ bytes for activations of run \d+"):
            s.run({"x": X})
        assert ex_arena.live == 0 and s.store.leases == 0
        ex_arena.limit = None
        assert s.counters["hot_runs"] == 3  # the refused run counts: it was hot
