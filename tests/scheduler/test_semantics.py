"""The cancellation and failure contract, one test per rule of ``onnx_prepared.scheduler``'s docstring.

Each test quotes the rule it proves. Ordering is controlled with gates, never with sleeps.
"""

from __future__ import annotations

import re
import sys
import threading

import pytest

import onnx_prepared.scheduler as scheduler_pkg
from onnx_prepared.errors import Cancelled, InternalError
from onnx_prepared.scheduler import HandleState, MemoryBudget, MemoryEstimate, Priority, Resource, Task, TaskState

from .conftest import TIMEOUT, Gate

TS = TaskState


def quote(rule: str) -> str:
    """The rule's text from the package docstring, whitespace collapsed (fails if it stops stating it)."""
    doc = scheduler_pkg.__doc__ or ""
    m = re.search(rf"\n{rule}\. (.*?)(?=\n[A-Z]\d\. |\n\n)", doc, re.S)
    assert m is not None, rule
    return " ".join(m.group(1).split())


def test_rules_are_stated_once_in_the_package_docstring():
    doc = scheduler_pkg.__doc__ or ""
    for rule in [f"S{i}" for i in range(1, 6)] + [f"C{i}" for i in range(1, 9)] + [f"F{i}" for i in range(1, 6)] + [
        f"H{i}" for i in range(1, 5)
    ]:
        assert doc.count(f"\n{rule}. ") == 1, rule


# **** Cancellation ****


def test_C1_cancelled_tasks_never_start(sched):
    """C1. After ``handle.cancel()`` returns, no task that only this submission wants will start;
    tasks added to it later are cancelled at once."""
    assert "no task that only" in quote("C1")
    gate = Gate()
    started: list[str] = []
    first = Task(gate.body(), name="first")
    rest = [Task(lambda t, i=i: started.append(f"r{i}"), deps=[first], name=f"r{i}") for i in range(5)]
    h = sched.submit(rest)
    assert gate.started.wait(TIMEOUT)
    h.cancel()
    late = Task(lambda t: started.append("late"), name="late")
    h.add(late)
    assert late.state is TS.CANCELLED
    gate.open()
    with pytest.raises(Cancelled):
        h.wait(TIMEOUT)
    assert started == []
    assert all(t.state is TS.CANCELLED for t in rest)
    assert h.status is HandleState.CANCELLED


def test_C2_started_tasks_see_the_token_and_are_joined(sched):
    """C2. A started task is never abandoned: its token is set and the submission waits for it to return."""
    assert "never abandoned" in quote("C2")
    entered, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def body(t):
        entered.set()
        assert release.wait(TIMEOUT)
        seen.append(t.token.cancelled)
        t.token.check()  # raises Cancelled: the effect did not happen
        seen.append("not reached")

    task = Task(body)
    h = sched.submit([task])
    assert entered.wait(TIMEOUT)
    h.cancel()
    assert h.status is HandleState.CANCELLING and not h.is_ready()  # joined, not abandoned
    assert task.token.cancelled
    release.set()
    with pytest.raises(Cancelled):
        h.wait(TIMEOUT)
    assert seen == [True] and task.state is TS.CANCELLED


def test_C3_a_body_that_finishes_after_cancellation_succeeded(sched):
    """C3. ``Cancelled`` means the effect did not happen: a body that raises it ends CANCELLED; a body
    that returns normally after cancellation ends SUCCEEDED."""
    assert "effect did not happen" in quote("C3")
    gate = Gate()
    done = Task(gate.body("effect"), name="ignores token")
    never = Task(lambda t: None, deps=[done], name="never")
    h = sched.submit([never])
    assert gate.started.wait(TIMEOUT)
    h.cancel()
    gate.open()
    with pytest.raises(Cancelled):
        h.wait(TIMEOUT)
    assert done.state is TS.SUCCEEDED and done.result == "effect"
    assert never.state is TS.CANCELLED

    # All effects happened before cancel() took effect: the submission SUCCEEDED.
    gate2 = Gate()
    only = Task(gate2.body("x"))
    h2 = sched.submit([only])
    assert gate2.started.wait(TIMEOUT)
    h2.cancel()
    gate2.open()
    h2.wait(TIMEOUT)
    assert h2.status is HandleState.SUCCEEDED


def test_C4_cancel_is_idempotent_and_a_noop_when_terminal(sched):
    """C4. ``cancel()`` is idempotent and non-blocking; on a terminal submission it does nothing."""
    assert "idempotent" in quote("C4")
    t = Task(lambda t: 1)
    h = sched.submit([t], result=t)
    assert h.result(TIMEOUT) == 1
    h.cancel()
    h.cancel()
    assert h.status is HandleState.SUCCEEDED and h.result() == 1
    gate = Gate()
    h2 = sched.submit([Task(gate.body())])
    assert gate.started.wait(TIMEOUT)
    h2.cancel()
    h2.cancel()  # returns at once although a task is still running
    assert h2.status is HandleState.CANCELLING
    gate.open()
    h2.wait(TIMEOUT)  # the only task finished normally (C3)


def test_C5_cancelling_one_submission_keeps_shared_tasks_others_want(sched):
    """C5. Cancelling one submission never cancels a task another live submission wants ... A task is
    cancelled when its last interested submission cancels. A cancelled submission does not wait for
    shared tasks it released."""
    assert "never cancels a task another live submission wants" in quote("C5")
    gate = Gate()
    holder = Task(gate.body(), resource=Resource.IO, name="holder")
    shared = Task(lambda t: "W0", deps=[holder], name="S0")  # a session task, e.g. read/prepack W0
    i1 = Task(lambda t: shared.result + "@1", deps=[shared], name="I0@run-1")
    i2 = Task(lambda t: shared.result + "@2", deps=[shared], name="I0@run-2")
    prep = sched.submit([shared], fail_fast=False)  # eager preparation handle
    run1 = sched.submit([i1], result=i1)
    run2 = sched.submit([i2], result=i2)
    assert gate.started.wait(TIMEOUT)
    run1.cancel()
    # run1 does not wait for the shared chain it released: it is terminal while the holder still blocks.
    with pytest.raises(Cancelled):
        run1.wait(TIMEOUT)
    assert shared in run1.diagnostics.released and i1.state is TS.CANCELLED
    assert shared.state is TS.PENDING
    prep.cancel()  # run2 still wants it
    assert shared.state is TS.PENDING
    gate.open()
    assert run2.result(TIMEOUT) == "W0@2"
    assert shared.state is TS.SUCCEEDED
    with pytest.raises(Cancelled):
        prep.wait(TIMEOUT)

    # The last interested submission cancels: the shared task is cancelled.
    gate2 = Gate()
    h0 = Task(gate2.body(), resource=Resource.IO)
    s2 = Task(lambda t: 1, deps=[h0], name="S1")
    a = sched.submit([Task(lambda t: 1, deps=[s2])])
    b = sched.submit([Task(lambda t: 1, deps=[s2])])
    assert gate2.started.wait(TIMEOUT)
    a.cancel()
    assert s2.state is TS.PENDING
    b.cancel()
    assert s2.state is TS.CANCELLED
    gate2.open()
    for x in (a, b):
        with pytest.raises(Cancelled):
            x.wait(TIMEOUT)


def test_C6_cancelled_is_a_base_exception():
    """C6. ``Cancelled`` derives from ``BaseException``, so ``except Exception`` cannot swallow it."""
    assert "BaseException" in quote("C6")
    assert issubclass(Cancelled, BaseException) and not issubclass(Cancelled, Exception)


def test_C7_cleanup_releases_slots_and_memory_of_cancelled_and_failed_tasks(make_scheduler):
    """C7. Cleanup always runs: a cancelled or failed task's slot and memory charge are released; leases
    it already handed out stay with their owner."""
    assert "Cleanup always runs" in quote("C7")
    s = make_scheduler(memory=MemoryBudget(100))
    leases = []
    entered, release = threading.Event(), threading.Event()

    def body(t):
        leases.append(t.retain(10))
        entered.set()
        assert release.wait(TIMEOUT)
        t.token.check()

    running = Task(body, memory=MemoryEstimate(output=10, temp=20), name="running")
    queued = Task(lambda t: None, memory=MemoryEstimate(output=90), name="queued")  # blocked on memory
    failing = Task(lambda t: 1 / 0, memory=MemoryEstimate(output=5))
    h = s.submit([running, queued])
    assert entered.wait(TIMEOUT)
    assert queued.state is TS.READY and s.memory_usage()["total"] == 30
    h.cancel()
    release.set()
    with pytest.raises(Cancelled):
        h.wait(TIMEOUT)
    assert s.memory_usage()["total"] == 10  # only the lease the owner still holds
    with pytest.raises(ZeroDivisionError):
        s.submit([failing]).wait(TIMEOUT)
    assert s.memory_usage()["total"] == 10
    leases[0].release()
    st = s.stats()
    assert st["memory"]["total"] == 0 and all(r["running"] == 0 for r in st["resources"].values())


def test_C8_dependents_of_a_cancelled_task_are_cancelled_and_a_wanted_task_is_revived(sched):
    """C8. Dependents of a cancelled task are cancelled (their ``cause`` names it). A cancelled task is
    revived, with a fresh token, when a later submission wants it ... Succeeded, failed and suppressed
    tasks never run again."""
    assert "revived" in quote("C8")
    gate = Gate()
    g = Task(gate.body(), resource=Resource.IO, name="gate")
    root = Task(lambda t: 1, deps=[g], name="root")
    dep = Task(lambda t: 2, deps=[root], name="dep")
    h = sched.submit([dep])
    assert gate.started.wait(TIMEOUT)
    h.cancel()
    assert (root.state, dep.state) == (TS.CANCELLED, TS.CANCELLED)
    assert root.cause is None and dep.cause is root
    old_token = root.token
    gate.open()
    with pytest.raises(Cancelled):
        h.wait(TIMEOUT)
    assert set(h.diagnostics.cancelled) == {root, dep}
    later = Task(lambda t: root.result + 10, deps=[root], name="later")  # a new run on the same generation
    h2 = sched.submit([later], result=later)
    assert h2.result(TIMEOUT) == 11
    assert root.state is TS.SUCCEEDED and root.token is not old_token and not root.token.cancelled
    assert dep.state is TS.CANCELLED  # nobody wanted it again
    assert set(h.diagnostics.cancelled) == {root, dep}  # the first submission's record is final

    # A body that raised Cancelled is revived too; finished tasks are shared, never rerun.
    runs = []
    entered, release = threading.Event(), threading.Event()

    def body(t):
        runs.append(t.runs)
        if t.runs == 1:
            entered.set()
            assert release.wait(TIMEOUT)
            t.token.check()
        return "second run"

    twice = Task(body, name="twice")
    h3 = sched.submit([twice])
    assert entered.wait(TIMEOUT)
    h3.cancel()
    release.set()
    with pytest.raises(Cancelled):
        h3.wait(TIMEOUT)
    assert sched.submit([twice], result=twice).result(TIMEOUT) == "second run"
    sched.submit([twice]).wait(TIMEOUT)
    assert runs == [1, 2]
    bad = Task(lambda t: 1 / 0)
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            sched.submit([bad]).wait(TIMEOUT)
    assert bad.runs == 1


# **** Failure ****


def test_F1_dependents_of_a_failed_task_are_suppressed_with_the_cause(sched):
    """F1. A task whose body raises is FAILED. Every task depending on it, transitively, is SUPPRESSED:
    it never runs and its ``cause`` is the failed task."""
    assert "SUPPRESSED" in quote("F1")
    ran: list[str] = []
    bad = Task(lambda t: (_ for _ in ()).throw(ValueError("bad weight")), name="bad")
    mid = Task(lambda t: ran.append("mid"), deps=[bad], name="mid")
    leaf = Task(lambda t: ran.append("leaf"), deps=[mid], name="leaf")
    h = sched.submit([leaf])
    with pytest.raises(ValueError, match="bad weight"):
        h.wait(TIMEOUT)
    assert ran == []
    assert (bad.state, mid.state, leaf.state) == (TS.FAILED, TS.SUPPRESSED, TS.SUPPRESSED)
    assert mid.cause is bad and leaf.cause is bad
    d = h.diagnostics
    assert d.failing_task is bad and set(d.suppressed) == {(mid, bad), (leaf, bad)}


def test_F2_fail_fast_cancels_siblings_but_joins_running_ones(make_scheduler):
    """F2. With ``fail_fast=True`` a submission's first failure also cancels the rest of that submission
    (siblings only it wants never start; started ones are joined). With ``fail_fast=False`` independent
    work continues."""
    assert "fail_fast" in quote("F2")
    s = make_scheduler(io_workers=2, io_reserved=0)
    gate = Gate()
    running = Task(gate.body("joined"), resource=Resource.IO, name="running sibling")
    fail_gate = threading.Event()

    def failing(t):
        assert fail_gate.wait(TIMEOUT)
        raise KeyError("boom")

    bad = Task(failing, name="bad")
    queued = Task(lambda t: "never", deps=[running], name="queued sibling")
    h = s.submit([running, bad, queued])
    assert gate.started.wait(TIMEOUT)
    failed = threading.Event()
    s.when_done(bad, lambda t: failed.set())
    fail_gate.set()
    assert failed.wait(TIMEOUT)
    # The failure is recorded, but the submission joins the running sibling before it is terminal.
    with pytest.raises(TimeoutError):
        h.wait(0)  # the gate is still held
    assert not h.is_ready() and running.token.cancelled
    gate.open()
    with pytest.raises(KeyError):
        h.wait(TIMEOUT)
    assert running.state is TS.SUCCEEDED and queued.state is TS.CANCELLED
    assert h.status is HandleState.FAILED and h.diagnostics.cancelled == (queued,)

    # fail_fast=False: independent work still runs; only the failed task's consumers are suppressed.
    bad2 = Task(lambda t: 1 / 0, name="bad2")
    consumer = Task(lambda t: 1, deps=[bad2], name="consumer")
    independent = Task(lambda t: "ran", name="independent")
    h2 = s.submit([consumer, independent], fail_fast=False)
    with pytest.raises(ZeroDivisionError):
        h2.wait(TIMEOUT)
    assert independent.result == "ran" and consumer.state is TS.SUPPRESSED


def test_F3_exactly_one_terminal_state_after_every_wanted_task(sched):
    """F3. Every submission reaches exactly one terminal state, only after every task it still wants is
    terminal: FAILED if any failed or was suppressed by a failure; otherwise CANCELLED ...; otherwise
    SUCCEEDED."""
    assert "exactly one terminal state" in quote("F3")
    calls: dict[str, list[HandleState]] = {"ok": [], "bad": [], "can": []}
    gate = Gate()
    can = sched.submit([Task(lambda t: 1, deps=[Task(gate.body(), resource=Resource.IO)])])
    can.add_done_callback(lambda hh: calls["can"].append(hh.status))  # registered while live
    ok = sched.submit([Task(lambda t: 1)])
    bad = sched.submit([Task(lambda t: 1 / 0)])
    assert gate.started.wait(TIMEOUT)
    can.cancel()
    gate.open()
    ok.wait(TIMEOUT)
    with pytest.raises(ZeroDivisionError):
        bad.wait(TIMEOUT)
    with pytest.raises(Cancelled):
        can.wait(TIMEOUT)
    ok.add_done_callback(lambda hh: calls["ok"].append(hh.status))  # registered when already terminal
    bad.add_done_callback(lambda hh: calls["bad"].append(hh.status))
    assert [ok.status, bad.status, can.status] == [HandleState.SUCCEEDED, HandleState.FAILED, HandleState.CANCELLED]
    assert calls == {"ok": [HandleState.SUCCEEDED], "bad": [HandleState.FAILED], "can": [HandleState.CANCELLED]}


def test_F3_failure_wins_over_cancellation(sched):
    """F3 ... FAILED if any of its tasks failed ... otherwise CANCELLED."""
    gate = Gate()

    def fails_after_gate(t):
        assert gate.opened.wait(TIMEOUT)
        gate.started.set()
        raise RuntimeError("real error")

    entered = threading.Event()

    def body(t):
        entered.set()
        return fails_after_gate(t)

    t = Task(body)
    h = sched.submit([t, Task(lambda t: 1, deps=[t])])
    assert entered.wait(TIMEOUT)
    h.cancel()
    gate.open()
    with pytest.raises(RuntimeError, match="real error"):
        h.wait(TIMEOUT)
    assert h.status is HandleState.FAILED


def test_F4_wait_raises_the_first_failure_and_diagnostics_keep_the_rest(make_scheduler):
    """F4. ``wait()`` and ``result()`` re-raise the first failure the submission observed (the others are
    in ``diagnostics.errors`` ...), or raise ``Cancelled`` for a CANCELLED submission. ``TimeoutError``
    when the timeout passes first."""
    assert "first failure" in quote("F4")
    s = make_scheduler(cpu_workers=1, cpu_reserved=0)
    first = Task(lambda t: 1 / 0, name="first")
    second = Task(lambda t: {}["k"], deps=[Task(lambda t: None, deps=[first], name="after-first")], name="x")
    third = Task(lambda t: [][1], name="third")  # fails after first (single worker, FIFO)
    h = s.submit([first, third], fail_fast=False)
    with pytest.raises(ZeroDivisionError):
        h.wait(TIMEOUT)
    with pytest.raises(ZeroDivisionError):
        h.result(TIMEOUT)
    d = h.diagnostics
    assert [type(e) for e in d.errors] == [ZeroDivisionError, IndexError]
    assert d.failed == (first, third)
    group = d.exception_group()
    if sys.version_info >= (3, 11):
        assert list(group.exceptions) == list(d.errors) and "first, third" in str(group)  # type: ignore[union-attr]
    else:
        assert group is d.errors[0]
    assert second.state is TS.PENDING  # never submitted
    gate = Gate()
    h2 = s.submit([Task(gate.body())])
    with pytest.raises(TimeoutError):
        h2.wait(0)
    gate.open()
    h2.wait(TIMEOUT)


def test_F5_broken_invariants_raise_internal_error():
    """F5. Broken internal invariants raise InternalError, never a user error."""
    assert "InternalError" in quote("F5")
    from onnx_prepared.errors import OnnxPreparedError
    from onnx_prepared.memory import Domain

    assert not issubclass(InternalError, OnnxPreparedError)
    with pytest.raises(InternalError):
        MemoryBudget().release(Domain.IO, 1)
    with pytest.raises(InternalError):
        Task(lambda t: 1)._transition(TS.RUNNING)


# **** Scheduling rules quoted from the same docstring ****


def test_S2_background_cannot_starve_critical_work(make_scheduler):
    """S2. ``reserved`` slots ... are never used by prefetch or background work, and the memory budget's
    ``critical_reserve`` is never charged by it."""
    assert "never used by prefetch or background work" in quote("S2")
    s = make_scheduler(memory=MemoryBudget(100, critical_reserve=25), io_workers=2, io_reserved=1)
    gate = Gate()
    flood = [Task(gate.body(), resource=r, priority=Priority.BACKGROUND, memory=MemoryEstimate(output=25))
             for r in ("io", "cpu") for _ in range(4)]
    hf = s.submit(flood)
    assert gate.started.wait(TIMEOUT)
    chain: list[Task] = []
    for r in ("io", "cpu", "inline", "io", "cpu"):
        chain.append(Task(lambda t: len(chain), resource=r, deps=chain[-1:], memory=MemoryEstimate(output=25)))
    h = s.submit(chain, result=chain[-1])
    h.wait(TIMEOUT)
    assert gate.entered == 2
    gate.open()
    hf.wait(TIMEOUT)


def test_S2_background_work_starts_behind_the_critical_work_in_flight(sched):
    """S2. A background task starts behind the critical work in flight ... (critical tasks started later
    do not hold it, so it is never starved)."""
    assert "critical tasks started later do not hold it" in quote("S2")
    first, second = Gate(), Gate()
    order: list[str] = []
    run1 = Task(first.body(), resource="cpu", name="run1")
    h1 = sched.submit(run1)
    assert first.started.wait(TIMEOUT)
    table = Task(lambda t: order.append(("table", run1.state, run2.state)), resource="io",
                 priority=Priority.BACKGROUND, name="table")
    hb = sched.submit(table)
    assert table.state is TS.READY  # an I/O slot is free, yet it waits behind run1
    run2 = Task(second.body(), resource="cpu", name="run2")  # starts after the table was held
    h2 = sched.submit(run2)
    assert second.started.wait(TIMEOUT)
    assert table.state is TS.READY
    first.open()
    hb.wait(TIMEOUT)  # run1 ended: the table runs although run2 is still in flight
    assert order == [("table", TS.SUCCEEDED, TS.RUNNING)]
    second.open()
    h1.wait(TIMEOUT)
    h2.wait(TIMEOUT)


def test_S2_a_yielded_critical_task_still_holds_background_work(sched):
    """A continuation that yields (S4 resume_after) to wait for a read is still critical work in flight:
    a background task queued meanwhile waits through its next segment and starts once it ended."""
    gate, second = Gate(), Gate()
    order: list[str] = []
    read = Task(gate.body(), resource="io", name="read")
    rest = second.body()

    def run(t):
        if read.state is not TS.SUCCEEDED:
            return t.resume_after(read)
        rest(t)  # the continuation's second segment, held by the test
        order.append("run")

    cont = Task(run, resource="cpu", name="run")
    h = sched.submit(cont)
    assert gate.started.wait(TIMEOUT)  # cont yielded to the read, which holds the reserved I/O slot
    table = Task(lambda t: order.append("table"), resource="cpu", priority=Priority.BACKGROUND, name="table")
    hb = sched.submit(table)
    assert table.state is TS.READY and cont.state is TS.PENDING
    gate.open()
    assert second.started.wait(TIMEOUT)  # cont runs again: the read it waited for ended, cont did not
    assert table.state is TS.READY  # a CPU slot is free, yet the table waits behind cont
    second.open()
    h.wait(TIMEOUT)
    hb.wait(TIMEOUT)
    assert order == ["run", "table"]
