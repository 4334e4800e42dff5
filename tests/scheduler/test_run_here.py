"""RuntimeScheduler.run_here: a ready, short piece of work run on the caller's thread, with the terminal
handle a one-task inline submission would give, and no task, queue or lock round trip."""

from __future__ import annotations

import threading

import pytest

from onnx_prepared.errors import Cancelled, CancelledError, ClosedError
from onnx_prepared.scheduler import HandleState, Resource, Task


def test_success_runs_on_the_calling_thread_and_the_handle_is_terminal(sched):
    where, calls = [], []
    h = sched.run_here(lambda: where.append(threading.get_ident()), result=lambda: calls.append(1) or 42)
    assert where == [threading.get_ident()]
    assert h.done() and h.status is HandleState.SUCCEEDED
    assert h.result() == 42 and h.result() == 42 and calls == [1]  # the result callable runs once
    fired = []
    h.add_done_callback(fired.append)
    assert fired == [h]  # already terminal: called once, now
    assert h.future.result() == 42
    assert sched.stats()["live_submissions"] == 0


def test_failure_is_reraised_with_a_named_failing_task(sched):
    err = ValueError("boom")

    def fail():
        raise err

    h = sched.run_here(fail, result=lambda: 1, name="I.run-7")
    assert h.status is HandleState.FAILED
    with pytest.raises(ValueError, match="boom"):
        h.result()
    d = h.diagnostics
    assert d.errors == (err,) and d.failing_task.name == "I.run-7"
    assert h.exception() is err


def test_a_checkpoint_of_the_enclosing_task_cancels_it(sched):
    def cancelled():
        raise Cancelled("task 'outer' was cancelled")

    h = sched.run_here(cancelled, name="I.run-1")
    assert h.status is HandleState.CANCELLED and h.cancelled()
    with pytest.raises(CancelledError):
        h.result()
    assert [t.name for t in h.diagnostics.cancelled] == ["I.run-1"]


def test_nothing_is_queued_unless_tracing(make_scheduler):
    seen = []
    plain = make_scheduler(audit=lambda t, q: seen.append(t.name))
    plain.run_here(lambda: None, name="a").result()
    assert seen == []  # no task took a slot
    traced = make_scheduler(trace=True, audit=lambda t, q: seen.append((t.name, q.name)))
    assert traced.run_here(lambda: None, result=lambda: 5, name="b").result() == 5
    assert seen == [("b", Resource.INLINE.value)]
    assert [r.name for r in traced.trace.records()] == ["b"]


def test_a_closed_scheduler_refuses(make_scheduler):
    s = make_scheduler()
    s.close()
    with pytest.raises(ClosedError):
        s.run_here(lambda: None)
    with pytest.raises(ClosedError):
        s.submit(Task(lambda t: None))


