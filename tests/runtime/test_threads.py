"""Threading policy (``onnx_prepared.kernels.threads``): budgets from ``intra_op_num_threads``, fewer kernel
threads while preparation holds CPU slots, BLAS fixed for every run, executor defaults that scale."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from onnx_prepared.kernels import _blas, threads
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime.builder import default_scheduler
from onnx_prepared.scheduler import CpuExecutor, Priority, Resource, RuntimeScheduler, Task
from tests.helpers.models import gemm_mlp


class _Gauge:
    def __init__(self, n: int):
        self.n = n

    def cpu_preparation_running(self) -> int:
        return self.n


@pytest.fixture
def unbound():
    """Leave this thread's binding as a test found it (kernels called outside runs see the machine)."""
    saved = dict(threads._local.__dict__)
    yield
    threads._local.__dict__.clear()
    threads._local.__dict__.update(saved)


def test_budget_from_intra_op_num_threads():
    assert threads.resolve(0) == threads.resolve(None) == threads.machine_threads() >= 1
    assert threads.resolve(3) == 3
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        threads.resolve(-1)


def test_available_subtracts_running_preparation_never_below_one(unbound):
    gauge = _Gauge(0)
    threads.bind(4, gauge)
    assert threads.available() == 4
    gauge.n = 1
    assert threads.available() == 3
    gauge.n = 9
    assert threads.available() == 1
    threads.bind(2, None)
    assert threads.available() == 2


def test_binding_is_per_thread(unbound):
    threads.bind(1, None)
    seen = []
    t = threading.Thread(target=lambda: seen.append(threads.available()))
    t.start()
    t.join()
    assert seen == [threads.machine_threads()] and threads.available() == 1


def test_default_scheduler_scales_with_the_machine():
    cpu = default_scheduler().cpu
    n = threads.machine_threads()
    assert cpu.workers == n and cpu.critical_reserved == (1 if n > 1 else 0)


@pytest.fixture
def mlp(tmp_path):
    return gemm_mlp(tmp_path, layers=3, width=16, share_b=False)


def test_intra_op_num_threads_sets_the_session_budget_without_a_scheduler_of_its_own(mlp):
    with RuntimeSession(mlp, {"intra_op_num_threads": 3}) as s:
        assert s.intra_op_threads == 3 and s.scheduler is default_scheduler()
    with RuntimeSession(mlp) as s:
        assert s.intra_op_threads == threads.machine_threads()


def test_cold_run_kernels_get_the_threads_preparation_leaves(mlp, monkeypatch):
    """A preparation task held on the CPU (gated) while the first run executes: every action of that cold
    run sees budget - 1 threads; a later hot run sees the whole budget. BLAS stays at its fixed count."""
    cpu = CpuExecutor(2, critical_reserved=1)
    sched = RuntimeScheduler(cpu=cpu, io_workers=2)
    started, release = threading.Event(), threading.Event()

    def hold(_t):
        started.set()
        assert release.wait(20)

    x = {"x": np.ones((2, 16), np.float32)}
    seen: list[int] = []
    try:
        with RuntimeSession(mlp, {"intra_op_num_threads": 2}, scheduler=sched) as s:
            blocker = sched.submit(Task(hold, resource=Resource.CPU, priority=Priority.PREFETCH, name="P.hold"))
            assert started.wait(20)
            assert sched.cpu_preparation_running() == 1
            with s.trace_actions(lambda pc: seen.append(threads.available())):
                cold = s.run(x)
            assert seen and set(seen) == {1}
            if _blas.available():
                assert _blas._current == threads.DEFAULT_BLAS_THREADS
            release.set()
            blocker.wait()
            assert sched.cpu_preparation_running() == 0
            s.prepare()
            hot_seen = []
            orig = threads.bind

            def spy(*a, **k):
                orig(*a, **k)
                hot_seen.append(threads.available())

            monkeypatch.setattr(threads, "bind", spy)
            hot = s.run(x)
            assert hot_seen == [2] and s.counters["hot_runs"] == 1
            assert all(np.array_equal(a, b) for a, b in zip(cold, hot))
    finally:
        release.set()
        sched.close(cancel=True)
        cpu.close()


def test_cold_run_binds_its_threads_before_every_segment(tmp_path, monkeypatch):
    """Preparation starts and ends during a cold run: the continuation binds before each segment's first
    action (not once per run), so the native pool grows back as soon as preparation leaves the cores."""
    path = gemm_mlp(tmp_path, layers=3)
    events: list[tuple[str, int]] = []
    bind = threads.bind

    def spy(*a, **k):
        events.append(("bind", -1))
        bind(*a, **k)

    monkeypatch.setattr(threads, "bind", spy)
    with RuntimeSession(path) as s:
        starts = [t.actions[0] for t in s.plan.invocation_tasks if t.actions[1] > t.actions[0]]
        assert len(starts) == 3  # one segment per layer's weight
        with s.trace_actions(lambda pc: events.append(("act", pc))):
            s.run({"x": np.ones((2, 16), np.float32)})
        assert s.counters["cold_runs"] == 1
    for a in starts:  # an action is recorded once it returned: the bind before it is the event before
        i = events.index(("act", a))
        assert events[i - 1] == ("bind", -1), (a, events)


def test_bind_sizes_the_native_pool_once_per_change(unbound, monkeypatch):
    calls = []

    class FakeNative:
        @staticmethod
        def set_num_threads(n):
            calls.append(n)

    monkeypatch.setattr(threads, "_native", lambda: FakeNative)
    monkeypatch.setattr(threads, "_native_threads", None)
    gauge = _Gauge(1)
    threads.bind(3, gauge)
    threads.bind(3, gauge)  # unchanged: no resize
    gauge.n = 0
    threads.bind(3, gauge)
    assert calls == [2, 3]


def test_native_pool_follows_the_budget_when_built(unbound):
    native = threads._native()
    if native is None:
        pytest.skip("native extension not built")
    before = native.get_num_threads()
    try:
        threads.bind(1, None)
        assert native.get_num_threads() == 1
    finally:
        threads.bind(before, None)


def test_bind_with_nothing_changed_calls_neither_blas_nor_the_pool(unbound, monkeypatch):
    """Every run binds; the common case is one comparison, and any change (this thread's budget or gauge,
    the process-wide BLAS count or pool size moved by another run) takes the full path again."""
    from onnx_prepared.kernels import _blas

    blas_calls: list = []
    pool_calls: list = []
    monkeypatch.setattr(_blas, "_current", None)

    def set_threads(n):  # as the real one: OpenBLAS is called only when the count differs
        if n != _blas._current:
            blas_calls.append(n)
            _blas._current = n

    monkeypatch.setattr(_blas, "set_threads", set_threads)
    monkeypatch.setattr(threads, "_sync_native", pool_calls.append)
    monkeypatch.setattr(threads, "_native_threads", 2)
    gauge = _Gauge(1)
    threads.bind(3, gauge, blas=1)
    assert blas_calls == [1] and pool_calls == [2]
    for _ in range(3):
        threads.bind(3, gauge, blas=1)  # nothing changed
    assert blas_calls == [1] and pool_calls == [2]
    gauge.n = 0  # preparation finished: the pool follows the gauge
    threads.bind(3, gauge, blas=1)
    assert len(pool_calls) == 2 and pool_calls[-1] == 3
    monkeypatch.setattr(threads, "_native_threads", 3)
    _blas._current = 4  # another session's run set BLAS process-wide
    threads.bind(3, gauge, blas=1)
    assert blas_calls == [1, 1] and threads.available() == 3


def test_cold_run_follows_preparation_between_actions_within_a_segment(mlp, unbound):
    """Preparation leaves the cores in the middle of a segment (a run that stopped yielding early has one
    long segment): the continuation re-binds after the action during which the gauge changed, so the
    next action's native pool has the whole budget. The gauge is faked: it is a hint the run reads."""
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=2)
    gauge = {"n": 1}
    sched.cpu_preparation_running = lambda: gauge["n"]  # what the run reads between actions
    pool: dict[int, int | None] = {}

    def after(pc: int) -> None:
        pool[pc] = threads._native_threads
        if pc == 0:
            gauge["n"] = 0  # preparation ended while action 0 ran

    try:
        with RuntimeSession(mlp, {"intra_op_num_threads": 2}, scheduler=sched) as s:
            (a, b) = s.plan.invocation_tasks[0].actions
            assert b - a == 2  # one segment: Gemm, Relu
            with s.trace_actions(after):
                s.run({"x": np.ones((2, 16), np.float32)})
            assert s.counters["cold_runs"] == 1
        assert pool[0] == 1 and pool[1] == 2, pool
    finally:
        sched.close(cancel=True)
        sched.cpu.close()
