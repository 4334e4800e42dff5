"""WorkerPool (persistent threads, FIFO, orderly joined shutdown) and CpuExecutor (slots, inline nesting)."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from onnx_prepared.errors import Cancelled, InternalError
from onnx_prepared.scheduler import CancelToken, CpuExecutor, WorkerPool

from .conftest import TIMEOUT, Gate


def test_pool_runs_every_job_on_its_own_threads():
    pool = WorkerPool(3, name="t")
    seen: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def job(i):
        with lock:
            seen.append(threading.get_ident())
            if len(seen) == 100:
                done.set()

    for i in range(100):
        pool.submit(job, i)
    assert done.wait(TIMEOUT)
    pool.close()
    assert len(seen) == 100
    assert set(seen) <= {t.ident for t in pool.threads}


def test_single_worker_is_fifo():
    order: list[int] = []
    with WorkerPool(1) as pool:
        for i in range(50):
            pool.submit(order.append, i)
    assert order == list(range(50))


def test_no_thread_outlives_close():
    before = set(threading.enumerate())
    pool = WorkerPool(4, name="outlive")
    gate = Gate()
    pool.submit(gate.body())
    assert gate.started.wait(TIMEOUT)
    threads = pool.threads
    assert all(t.is_alive() for t in threads)
    closer = threading.Thread(target=pool.close)
    closer.start()
    gate.open()  # close() must wait for the running job, then join everything
    closer.join(TIMEOUT)
    assert not closer.is_alive()
    assert not any(t.is_alive() for t in threads)
    assert set(threading.enumerate()) - before == set()


def test_close_runs_jobs_queued_before_it():
    ran: list[int] = []
    pool = WorkerPool(1)
    gate = Gate()
    pool.submit(gate.body())
    for i in range(10):
        pool.submit(ran.append, i)
    closer = threading.Thread(target=pool.close)
    closer.start()
    gate.open()
    closer.join(TIMEOUT)
    assert ran == list(range(10))


def test_submit_after_close_raises_and_close_is_idempotent():
    pool = WorkerPool(2)
    pool.close()
    pool.close()
    assert pool.closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(print)


def test_close_from_own_worker_is_refused():
    pool = WorkerPool(1)
    out: list[BaseException] = []
    done = threading.Event()

    def job():
        try:
            pool.close()
        except RuntimeError as e:
            out.append(e)
        done.set()

    pool.submit(job)
    assert done.wait(TIMEOUT)
    pool.close()
    assert len(out) == 1 and "own workers" in str(out[0])


def test_raising_job_is_logged_and_reported_at_close(caplog):
    pool = WorkerPool(1, name="bad")
    with caplog.at_level(logging.ERROR, logger="onnx_prepared.scheduler"):
        pool.submit(lambda: 1 / 0)
        ok = threading.Event()
        pool.submit(ok.set)  # the worker survived the failing job
        assert ok.wait(TIMEOUT)
    assert any("job raised" in r.message for r in caplog.records)
    with pytest.raises(InternalError) as ei:
        pool.close()
    assert isinstance(ei.value.__cause__, ZeroDivisionError)


def test_owns_current_thread():
    pool = WorkerPool(1)
    res: list[bool] = []
    done = threading.Event()
    pool.submit(lambda: (res.append(pool.owns_current_thread()), done.set()))
    assert done.wait(TIMEOUT)
    pool.close()
    assert res == [True]
    assert not pool.owns_current_thread()


def test_pool_rejects_zero_workers():
    with pytest.raises(ValueError):
        WorkerPool(0)


# **** CpuExecutor ****


def test_cpu_executor_defaults_reserve_one_critical_slot():
    with CpuExecutor() as cpu:
        assert cpu.workers == max(2, os.cpu_count() or 1)
        assert cpu.critical_reserved == 1
        assert cpu.preparation_slots == cpu.workers - 1
    with pytest.raises(ValueError):
        CpuExecutor(2, critical_reserved=2)


def test_map_and_parallel_for_from_outside():
    with CpuExecutor(2) as cpu:
        assert cpu.map(lambda x: x * x, range(20)) == [x * x for x in range(20)]
        out = [0] * 64
        cpu.parallel_for(64, lambda i: out.__setitem__(i, i + 1))
        assert out == list(range(1, 65))
        assert cpu.map(str, []) == []


def test_parallel_for_completes_even_when_every_worker_is_busy():
    """The caller participates, so a fully occupied pool cannot deadlock a parallel region."""
    with CpuExecutor(2) as cpu:
        gate = Gate()
        cpu.pool.submit(gate.body())
        cpu.pool.submit(gate.body())
        out = cpu.map(lambda x: x + 1, range(10))
        assert out == list(range(1, 11))
        gate.open()


def test_parallel_for_inside_a_worker_runs_inline():
    with CpuExecutor(2) as cpu:
        threads: set[int] = set()
        outer: list[int] = []
        done = threading.Event()

        def job():
            outer.append(threading.get_ident())
            assert cpu.in_worker()
            cpu.parallel_for(32, lambda i: threads.add(threading.get_ident()))
            done.set()

        cpu.pool.submit(job)
        assert done.wait(TIMEOUT)
        assert threads == set(outer)
        assert not cpu.in_worker()


def test_parallel_for_reraises_first_error_after_joining():
    with CpuExecutor(2) as cpu:
        lock = threading.Lock()
        active = [0]

        def fn(i):
            with lock:
                active[0] += 1
            try:
                if i == 3:
                    raise KeyError(i)
                sum(range(2000))
            finally:
                with lock:
                    active[0] -= 1

        with pytest.raises(KeyError):
            cpu.parallel_for(64, fn)
        assert active[0] == 0  # every claimed index returned before parallel_for did


def test_parallel_for_stops_on_cancelled_token():
    with CpuExecutor(2) as cpu:
        token = CancelToken("t")
        calls: list[int] = []

        def fn(i):
            calls.append(i)
            token.cancelled = True

        with pytest.raises(Cancelled):
            cpu.parallel_for(1000, fn, token=token)
        assert len(calls) < 1000
