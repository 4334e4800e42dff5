"""The runtime scheduler: task graphs on I/O, CPU, inline and device resources, with memory admission.

It knows nothing about ONNX; the prepared session builds tasks and submits them. Modules:
``workers`` (WorkerPool), ``executor`` (CpuExecutor), ``task`` (Task, states, Priority, Resource),
``estimates`` (MemoryEstimate, MemoryLease), ``admission`` (the budget's waitlist: S1/S2), ``runtime``
(RuntimeScheduler), ``handle`` (ExecutionHandle), ``trace`` (Chrome trace export). The domains and the
byte budget belong to :mod:`onnx_prepared.memory`, the one memory ledger.

Terms
-----
A *task* is one unit of work, ``fn(task)``, on one resource class. A *submission* wants a set of tasks:
the ones it names plus every unfinished task they transitively depend on. A task may be wanted by several
live submissions at once (a shared session task); its *interest* is the set of those submissions.
A task is *started* once it holds a slot (state RUNNING).

Scheduling
----------
S1. A task runs when every dependency SUCCEEDED, its resource has a free slot for its priority class,
    and its memory charge is admitted. Memory is admitted before dispatch and released when the task
    completes, except bytes it hands to a :class:`MemoryLease` (``task.retain``), which its owner releases.
S2. Per resource, ``reserved`` slots (default: one CPU slot, one I/O slot) are never used by prefetch or
    background work, and the memory budget's ``critical_reserve`` is never charged by it; so background
    work cannot starve or deadlock critical work. Within a resource, more urgent priority classes are
    dispatched first, FIFO within a class, except that a task with a ``rank`` goes before the ranked
    tasks queued before it that rank higher (never ahead of an unranked one). A memory-blocked task is
    never overtaken by a task of the same or lower priority class. A charge larger than a limit on its
    own runs once nothing else holds bytes under that limit (see :class:`MemoryBudget`). A background
    task starts behind the critical work in flight: while critical tasks run, a ready background task
    that holds no memory waits until every critical task that was running when it first could have
    started has finished (critical tasks started later do not hold it, so it is never starved), as a
    whole-table read queued beside a first run would otherwise take disk and cores from that run.
S3. Priority inheritance: a task's unfinished producers are always at least as urgent as the task. A
    critical task that depends on a prefetch/background chain promotes the whole chain, including tasks
    already queued; ``promote(task, priority)`` does the same on demand.
S4. Dynamic graphs: a running task may ``return task.resume_after(producer, ...)``: it goes back to
    PENDING, the producers join every submission that wants it and inherit its priority, and it runs
    again once they all succeeded. ``handle.add(tasks)`` adds tasks to a live submission; naming a task
    submitted earlier (by anyone) shares it. ``when_done(task, fn)`` calls ``fn(task)`` once, when the
    task is terminal. A task body must never block on a handle (a worker would hold a slot while waiting
    for work that may need it): it yields with ``resume_after`` instead.
S5. Resources: I/O and each device have their own bounded worker pools; CPU tasks run on the leased
    session :class:`CpuExecutor` (no second pool), whose ``parallel_for``/``map`` run inline when called
    from one of its workers. ``inline`` tasks run on the thread that made them ready: the submitting
    thread inside ``submit()``, or the worker that finished their last dependency.

Cancellation (tests/scheduler/test_semantics.py quotes these)
---------------------------------------------------------------
C1. Cancellation is cooperative and level-triggered. After ``handle.cancel()`` returns, no task that only
    this submission wants will start; tasks added to it later are cancelled at once.
C2. A started task is never abandoned: its token is set (``task.token.cancelled`` is True and
    ``task.token.check()`` raises :class:`~onnx_prepared.errors.Cancelled`) and the submission waits for
    it to return before it becomes terminal.
C3. ``Cancelled`` means the effect did not happen: a body that raises it ends CANCELLED; a body that
    returns normally after cancellation ends SUCCEEDED (its effect happened).
C4. ``cancel()`` is idempotent and non-blocking; on a terminal submission it does nothing.
C5. Cancelling one submission never cancels a task another live submission wants (an eager preparation
    handle or another inference): it only withdraws its interest. A task is cancelled when its last
    interested submission cancels. A cancelled submission does not wait for shared tasks it released.
C6. ``Cancelled`` derives from ``BaseException``, so ``except Exception`` cannot swallow it inside a task
    (at the waiter boundary it becomes ``CancelledError``, W1).
C7. Cleanup always runs: a cancelled or failed task's slot and memory charge are released; leases it
    already handed out stay with their owner.
C8. Dependents of a cancelled task are cancelled (their ``cause`` names it). A cancelled task is revived,
    with a fresh token, when a later submission wants it (names it or depends on it): its effect did not
    happen, so it runs again; a session may therefore keep handing out a generation that an inference's
    cancel just withdrew, without a race. Succeeded, failed and suppressed tasks never run again: a retry
    after a failure is a new task (a new generation).

Failure
-------
F1. A task whose body raises is FAILED. Every task depending on it, transitively, is SUPPRESSED: it never
    runs and its ``cause`` is the failed task.
F2. With ``fail_fast=True`` (the default) a submission's first failure also cancels the rest of that
    submission as in C1/C2/C5 (siblings only it wants never start; started ones are joined). With
    ``fail_fast=False`` independent work continues: eager preparation uses it so that one bad object
    fails only its consumers.
F3. Every submission reaches exactly one terminal state, only after every task it still wants is
    terminal: FAILED if any of its tasks failed or was suppressed by a failure; otherwise CANCELLED if any
    of its tasks was cancelled or it released shared tasks by cancelling; otherwise SUCCEEDED.
F4. ``wait()`` and ``result()`` re-raise the first failure the submission observed (the others are in
    ``diagnostics.errors``, with the failing tasks, the suppressed tasks and their causes, the cancelled and
    the released tasks; ``diagnostics.exception_group()`` groups them all), or raise ``CancelledError``
    (W1) for a CANCELLED submission. ``TimeoutError`` when the timeout passes first (the submission keeps running).
F5. Broken internal invariants raise :class:`~onnx_prepared.errors.InternalError`, never a user error.

Handles
-------
H1. Dropping or garbage-collecting a live handle waits for its submission, because tasks may still use
    caller-owned inputs. (On one of this scheduler's own workers it cannot wait safely; it logs a warning
    instead. Never drop a live handle there.)
H2. ``with handle:`` waits on exit and re-raises a failure. If the block raises, the exit cancels the
    submission, waits for it to become terminal, and lets the block's exception propagate (the
    submission's own Cancelled is stripped: the block caused it).
H3. ``await handle`` returns ``result()`` without blocking the event loop; cancelling the awaiting
    asyncio task cancels the submission (as ``asyncio.wrap_future`` does).
H4. Done callbacks run once, after the terminal state and after ``wait()`` callers were released, on the
    thread that completed the submission and outside the scheduler lock (on the caller's thread if it was
    already terminal). ``when_done`` task callbacks run before the submissions they complete are released.

The waiter boundary (tests/scheduler/test_futures.py quotes these)
-------------------------------------------------------------------
W1. Trio inside, futures outside: task bodies see the bare ``Cancelled`` (a ``BaseException``, C6); a
    waiter (``wait``, ``result``, ``exception``, ``with handle``) sees
    :class:`~onnx_prepared.errors.CancelledError`, which is a ``concurrent.futures.CancelledError`` (an
    ``Exception``, so a server's ``except Exception`` contains it, as for a cancelled ``Future``) and
    still a ``Cancelled``.
W2. ``await handle`` on a cancelled submission raises ``asyncio.CancelledError``, as awaiting a cancelled
    asyncio future does.
W3. A handle answers ``concurrent.futures.Future``'s questions: ``done()``, ``cancelled()``,
    ``running()``, ``result(timeout)``, ``exception(timeout)`` (the error ``result`` would raise, or None;
    ``CancelledError`` if cancelled; ``TimeoutError`` first), ``add_done_callback``. ``cancel()`` returns
    whether the submission was still live; unlike a ``Future``, a running submission can be cancelled
    (C2), and one whose started tasks all finish anyway ends SUCCEEDED (C3).
W4. ``handle.future`` is a ``concurrent.futures.Future`` given the same outcome (result, exception or
    cancellation) once the submission is terminal, for ``concurrent.futures.wait`` / ``as_completed`` and
    ``asyncio.wrap_future``. Cancelling it cancels the submission; it is done only when the submission is.
"""

from __future__ import annotations

from onnx_prepared.errors import Cancelled
from onnx_prepared.memory import Domain, MemoryBudget
from onnx_prepared.scheduler.estimates import MemoryEstimate, MemoryLease
from onnx_prepared.scheduler.executor import CpuExecutor
from onnx_prepared.scheduler.handle import Diagnostics, ExecutionHandle, HandleState
from onnx_prepared.scheduler.runtime import RuntimeScheduler
from onnx_prepared.scheduler.task import CancelToken, Priority, Resource, Resume, Task, TaskState
from onnx_prepared.scheduler.trace import Trace, TraceRecord
from onnx_prepared.scheduler.workers import WorkerPool

__all__ = [
    "CancelToken",
    "Cancelled",
    "CancelledError",
    "CpuExecutor",
    "Diagnostics",
    "Domain",
    "ExecutionHandle",
    "HandleState",
    "MemoryBudget",
    "MemoryEstimate",
    "MemoryLease",
    "Priority",
    "Resource",
    "Resume",
    "RuntimeScheduler",
    "Task",
    "TaskState",
    "Trace",
    "TraceRecord",
    "WorkerPool",
]


def __getattr__(name: str):
    if name == "CancelledError":  # built on first use (onnx_prepared/errors.py: its base imports logging)
        from onnx_prepared import errors

        return errors.CancelledError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
