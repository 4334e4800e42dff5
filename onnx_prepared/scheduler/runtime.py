"""RuntimeScheduler: dependency events, priorities, resource queues, memory admission, cancellation.

One lock guards all scheduler state. Every public operation takes it once, records what must happen
outside it (wake workers, run inline tasks, call callbacks, finish submissions) in an :class:`_Effects`,
and performs that after releasing it, so no user code ever runs under the lock.

Workers pull work: a resource with a free slot gets a ``_drain`` job on its pool; the job runs its
task, then completes it and picks the next admitted task of that resource under the same lock
acquisition, so a busy resource costs one lock round-trip per task and no thread hand-off.

Semantics (what callers may rely on) are stated once in ``onnx_prepared.scheduler``'s docstring.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from onnx_prepared.errors import Cancelled, ClosedError, InvalidOptionError
from onnx_prepared.memory import MemoryBudget
from onnx_prepared.scheduler.admission import Admission
from onnx_prepared.scheduler.estimates import MemoryLease
from onnx_prepared.scheduler.executor import CpuExecutor
from onnx_prepared.scheduler.handle import _DONE, Diagnostics, ExecutionHandle, HandleState, _Submission
from onnx_prepared.scheduler.task import (
    IN_NONE,
    IN_READY,
    IN_WAIT,
    TERMINAL,
    CancelToken,
    Priority,
    Resource,
    Resume,
    Task,
    TaskState,
    _current,
)
from onnx_prepared.scheduler.trace import Trace
from onnx_prepared.scheduler.workers import WorkerPool, _log

S = TaskState
_PENDING, _READY, _RUNNING = S.PENDING, S.READY, S.RUNNING
_SUCCEEDED, _FAILED, _SUPPRESSED, _CANCELLED = S.SUCCEEDED, S.FAILED, S.SUPPRESSED, S.CANCELLED
_NONE: Any = ()  # shared empty edge/interest list of terminal tasks
_FINAL = frozenset({_SUCCEEDED, _FAILED, _SUPPRESSED})  # terminal for good (CANCELLED can be revived)
_OK, _FAIL, _CANCEL, _RESUME = 0, 1, 2, 3
_OUTCOME = ("succeeded", "failed", "cancelled", "resumed")
_UNBOUNDED = 1 << 30


class _ResourceQueue:
    """Ready tasks of one resource class, one deque per priority (FIFO, ranked tasks in rank order:
    :func:`_enqueue`), and its slot counters."""

    __slots__ = ("dirty", "name", "noncritical", "noncritical_limit", "pool", "ready", "reserved", "running", "slots")

    def __init__(self, name: str, pool: WorkerPool | None, slots: int, reserved: int):
        if slots < 1 or not 0 <= reserved < slots:
            raise InvalidOptionError(f"{name}_workers", slots, f"an int >= 1 with 0 <= reserved ({reserved}) < workers")
        self.name = name
        self.pool = pool  # None: inline (runs on the thread that made the task ready)
        self.slots = slots
        self.reserved = reserved
        self.noncritical_limit = slots - reserved
        self.running = 0  # invariant: running <= slots
        self.noncritical = 0  # invariant: noncritical <= noncritical_limit (prefetch/background running)
        self.ready: tuple[deque[Task], deque[Task], deque[Task]] = (deque(), deque(), deque())
        self.dirty = False  # listed in the current _Effects.dirty


class _Effects:
    """Work decided under the lock, done after it is released."""

    __slots__ = ("callbacks", "dirty", "inline", "starts", "subs")

    def __init__(self) -> None:
        self.dirty: list[_ResourceQueue] = []
        self.starts: list[Task] = []
        self.inline: list[Task] = []
        self.subs: list[_Submission] = []
        self.callbacks: list[tuple[list[Callable[[Task], Any]], Task]] = []


class RuntimeScheduler:
    """Runs task graphs on I/O, CPU, inline and per-device resources under one memory budget.

    >>> sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=4,
    ...                          memory=MemoryBudget(1 << 30, critical_reserve=64 << 20))
    >>> read = Task(read_w0, resource=Resource.IO, priority=Priority.PREFETCH)
    >>> pack = Task(prepack_w0, deps=[read], priority=Priority.PREFETCH)
    >>> sched.submit([pack], result=pack).result()

    ``cpu`` is leased, not owned, when given (the session's executor; :meth:`close` leaves it open).
    ``devices`` maps a device name to its worker count, or to ``(workers, critical_reserved)``; a device
    with one worker reserves none. Every public method is thread-safe.
    """

    def __init__(
        self,
        *,
        cpu: CpuExecutor | None = None,
        io_workers: int = 4,
        io_reserved: int | None = None,
        devices: Mapping[str, int | tuple[int, int]] | None = None,
        memory: MemoryBudget | None = None,
        trace: bool = False,
        audit: Callable[[Task, _ResourceQueue], None] | None = None,
        name: str = "onnx-prepared",
    ):
        self._lock = threading.Lock()
        self._owns_cpu = cpu is None
        self.cpu = cpu if cpu is not None else CpuExecutor(name=f"{name}-cpu")
        self.memory = memory if memory is not None else MemoryBudget()
        self._admission = Admission(self.memory)  # the memory waitlist lives there
        self._trace: Trace | None = Trace() if trace else None
        #: Test hook, called under the lock each time a task takes a slot: ``audit(task, queue)``.
        self._audit = audit
        self._closed = False
        self._crit_seq = 0  # critical dispatches so far (S2's background barrier)
        self._critical: set[int] = set()  # dispatch numbers of critical tasks in flight (running, or yielded)
        self._live: set[_Submission] = set()
        self._pools: list[WorkerPool] = []
        self._queues: dict[str, _ResourceQueue] = {}
        if isinstance(io_workers, bool) or not isinstance(io_workers, int) or io_workers < 1:
            raise InvalidOptionError("io_workers", io_workers, "an int >= 1")
        if io_reserved is None:  # one I/O worker kept for critical reads, unless there is only one
            io_reserved = 1 if io_workers > 1 else 0
        io_pool = WorkerPool(io_workers, name=f"{name}-io")
        self._pools.append(io_pool)
        self._queues[Resource.IO.value] = _ResourceQueue(Resource.IO.value, io_pool, io_workers, io_reserved)
        c = self.cpu
        self._cpu_queue = _ResourceQueue(Resource.CPU.value, c.pool, c.workers, c.critical_reserved)
        self._queues[Resource.CPU.value] = self._cpu_queue
        self._inline = _ResourceQueue(Resource.INLINE.value, None, _UNBOUNDED, 0)
        self._queues[Resource.INLINE.value] = self._inline
        for dev, spec in (devices or {}).items():
            workers, reserved = (spec, 1 if spec > 1 else 0) if isinstance(spec, int) else spec
            key = Resource.device(dev)
            pool = WorkerPool(workers, name=f"{name}-{dev}")
            self._pools.append(pool)
            self._queues[key] = _ResourceQueue(key, pool, workers, reserved)

    # ************************************************************************************************
    # **** Public API ****

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(self._queues)

    @property
    def trace(self) -> Trace | None:
        """The trace being recorded, or None when tracing is disabled."""
        return self._trace

    def enable_trace(self) -> Trace:
        if self._trace is None:
            self._trace = Trace()
        return self._trace

    def submit(
        self,
        tasks: Iterable[Task] | Task,
        *,
        result: Task | Callable[[], Any] | None = None,
        priority: Priority | None = None,
        fail_fast: bool = True,
        keepalive: Any = None,
    ) -> ExecutionHandle:
        """Want ``tasks`` and every unfinished task they depend on; return the submission's handle.

        Tasks submitted earlier (by any submission) are shared, never duplicated: this submission adds
        its interest to them. ``priority`` promotes the whole closure to at least that class.
        ``result`` designates ``handle.result()``: a task's value or a zero-argument callable called
        once after success. ``fail_fast`` (default) cancels the rest of the submission at its first
        failure; eager preparation passes False so one bad object fails only its consumers.
        ``keepalive`` is held until the submission is terminal (borrowed contexts, inputs).
        Never blocks, except that ready inline tasks run on the calling thread.
        """
        roots = (tasks,) if tasks.__class__ is Task else tuple(tasks)  # type: ignore[arg-type]
        if result is not None and result.__class__ is Task and all(result is not r for r in roots):
            roots = (*roots, result)
        sub = _Submission(self, fail_fast=fail_fast, result=result, keepalive=keepalive)
        fx = _Effects()
        with self._lock:
            if self._closed:
                raise ClosedError("RuntimeScheduler is closed: nothing can be submitted to it")
            self._attach(sub, roots, None if priority is None else int(priority), fx)  # may raise: nothing changed
            if sub.state not in _DONE:
                self._live.add(sub)
            self._dispatch(fx, None)
        self._after(fx)
        return ExecutionHandle(sub)

    def run_here(self, fn: Callable[[], Any], *, result: Callable[[], Any] | None = None,
                 name: str = "inline") -> ExecutionHandle:
        """Run ``fn()`` now, on the calling thread, and return its terminal handle.

        The outcome of submitting one dependency-free inline task (S5), without the task: no lock, no
        queue, no dispatch. For work that is ready and short (a hot run), where that round trip costs
        more than the work. The handle behaves as any terminal one: ``result()`` calls ``result`` once,
        a failure or a ``Cancelled`` raised by ``fn`` (a checkpoint of the task this thread runs) is
        re-raised, diagnostics name a task called ``name``, done callbacks fire once, immediately.
        While tracing it is an ordinary inline task, so the trace records it.
        """
        if self._closed:
            raise ClosedError("RuntimeScheduler is closed: nothing can be submitted to it")
        if self._trace is not None:
            return self.submit(Task(lambda t: fn(), resource=Resource.INLINE, name=name), result=result)
        sub = _Submission(self, fail_fast=True, result=result, keepalive=None)
        try:
            fn()
        except BaseException as e:
            t = Task(lambda t: fn(), resource=Resource.INLINE, name=name)  # the record diagnostics name
            t._sched = self
            for st in (_READY, _RUNNING, _CANCELLED if isinstance(e, Cancelled) else _FAILED):
                t._transition(st)
            t.fn = None
            sub.members[t] = None
            if t.state is _CANCELLED:
                sub.n_cancelled = 1
                sub._transition(HandleState.CANCELLED)
                sub.diagnostics = self._snapshot(sub)
            else:
                t.error = e
                sub.failed.append(t)
                sub.errors.append(e)
                sub._transition(HandleState.FAILED)
        else:
            sub._transition(HandleState.SUCCEEDED)
        sub.done.set()
        return ExecutionHandle(sub)

    def promote(self, task: Task, priority: Priority) -> None:
        """Raise ``task`` and its unfinished producer chain to at least ``priority`` (queued ones move)."""
        fx = _Effects()
        with self._lock:
            self._promote(task, int(priority), fx)
            self._dispatch(fx, None)
        self._after(fx)

    def when_done(self, task: Task, callback: Callable[[Task], Any]) -> None:
        """Call ``callback(task)`` once the task is terminal (now, on this thread, if it already is).

        Otherwise it runs on the thread that finished the task, outside the lock, after the task's
        dependents were released and before any submission it completed is signalled (so ``wait()``
        returns after it); exceptions are logged. A callback fires at the task's next terminal state: a
        cancelled task that a later submission revives (C8) fires callbacks registered after that.
        """
        with self._lock:
            if task.state not in TERMINAL:
                if task._callbacks is None:
                    task._callbacks = []
                task._callbacks.append(callback)
                return
        _call_logged(callback, task)

    def cpu_preparation_running(self) -> int:
        """CPU slots prefetch/background tasks hold now. Read without the lock: a hint for kernels sizing
        their intra-op threads (:mod:`onnx_prepared.kernels.threads`), never for scheduling decisions."""
        return self._cpu_queue.noncritical

    def memory_usage(self) -> dict[str, int]:
        """Bytes charged now, in total and per domain (running tasks plus unreleased leases)."""
        with self._lock:
            return self.memory.snapshot()

    def stats(self) -> dict[str, Any]:
        """A consistent snapshot for diagnostics and tests: slots in use, queue lengths, memory, live count."""
        with self._lock:
            return {
                "live_submissions": len(self._live),
                "memory": self.memory.snapshot(),
                "resources": {
                    q.name: {"running": q.running, "noncritical": q.noncritical,
                             "queued": sum(len(d) for d in q.ready)}
                    for q in self._queues.values()
                },
                "memory_waiting": len(self._admission),
            }

    def close(self, *, cancel: bool = False) -> None:
        """Refuse new submissions, wait for (or with ``cancel`` first cancel) live ones, join own workers.

        A leased CpuExecutor is left open for its owner. Idempotent; not callable from a worker.
        """
        for p in (*self._pools, self.cpu.pool):
            if p.owns_current_thread():
                raise RuntimeError("RuntimeScheduler cannot be closed from one of its own workers")
        with self._lock:
            self._closed = True
            live = list(self._live)
        if cancel:
            for sub in live:
                self._cancel_submission(sub)
        for sub in live:
            sub.done.wait()
        for p in self._pools:
            p.close()
        if self._owns_cpu:
            self.cpu.close()

    def __enter__(self) -> RuntimeScheduler:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.close(cancel=exc_type is not None)

    # ************************************************************************************************
    # **** Entry points used by ExecutionHandle, Task and MemoryLease ****

    def _owns_pool(self, pool: WorkerPool) -> bool:
        return pool is self.cpu.pool or pool in self._pools

    def _cancel_submission(self, sub: _Submission) -> None:
        fx = _Effects()
        with self._lock:
            if sub.state in _DONE or sub.cancel_requested:
                return
            sub._transition(HandleState.CANCELLING)
            self._cancel_sub(sub, fx)
            self._dispatch(fx, None)
        self._after(fx)

    def _extend(self, sub: _Submission, tasks: Iterable[Task] | Task) -> None:
        roots = (tasks,) if isinstance(tasks, Task) else tuple(tasks)
        fx = _Effects()
        with self._lock:
            if sub.state in _DONE:
                raise RuntimeError(f"cannot add tasks to a submission that is already {sub.state.name}")
            self._attach(sub, roots, None, fx)
            self._dispatch(fx, None)
        self._after(fx)

    def _add_sub_callback(self, sub: _Submission, cb: Callable[[], Any]) -> None:
        with self._lock:
            if sub.state not in _DONE:
                sub.callbacks.append(cb)
                return
        sub.done.wait()  # terminal under the lock; the event is set right after
        _call_logged(cb)

    def _diagnostics(self, sub: _Submission) -> Diagnostics:
        with self._lock:
            return sub.diagnostics if sub.diagnostics is not None else self._snapshot(sub)

    def _snapshot(self, sub: _Submission) -> Diagnostics:
        suppressed = [(t, t.cause) for t in sub.members if t.state is _SUPPRESSED and t.cause is not None]
        cancelled = [t for t in sub.members if t.state is _CANCELLED]
        return Diagnostics(sub.state, tuple(sub.failed), tuple(sub.errors), tuple(suppressed),
                           tuple(cancelled), tuple(sub.released))

    def _retain(self, task: Task, nbytes: int) -> MemoryLease:
        with self._lock:
            self._admission.retain(task, nbytes)
            return MemoryLease(self, task.memory.domain, nbytes)

    def _release_lease(self, lease: MemoryLease) -> None:
        fx = _Effects()
        with self._lock:
            if lease._released:
                return
            lease._released = True
            self._admission.release_lease(lease.domain, lease.nbytes)
            self._dispatch(fx, None)
        self._after(fx)

    # ************************************************************************************************
    # **** Attaching submissions (under the lock) ****

    def _attach(self, sub: _Submission, roots: tuple[Task, ...], priority: int | None, fx: _Effects) -> None:
        """Add ``roots`` and their unfinished dependency closure to ``sub``; queue what is ready."""
        members = sub.members
        order: list[Task] = []  # post-order: dependencies before dependents
        seen: set[Task] = set()
        for root in roots:
            if root.__class__ is not Task:
                raise TypeError(f"submit() takes Tasks, got {type(root).__name__}")
            if root in members or root in seen:
                continue
            self._check_attachable(root)
            seen.add(root)
            if root.state in _FINAL:
                order.append(root)
                continue
            for d in root._deps:  # fast path: dependencies already known (a whole graph in topological order)
                if d not in seen and d not in members:
                    break
            else:
                order.append(root)
                continue
            stack = [(root, iter(root._deps))]
            while stack:
                t, it = stack[-1]
                for d in it:
                    if d in members or d in seen:
                        continue
                    self._check_attachable(d)
                    seen.add(d)
                    stack.append((d, iter(d._deps) if d.state not in _FINAL else iter(())))
                    break
                else:
                    stack.pop()
                    order.append(t)
        # Nothing mutated above: a bad task raises before the submission changes.
        members.update(dict.fromkeys(order))  # ordered: dependencies first, so cancels cascade with causes
        sub.attaching = True
        fresh: list[Task] = []
        try:
            for t in order:
                st = t.state
                if st is _CANCELLED:  # wanted again: C8 revives it with a fresh token
                    self._revive(t)
                elif st in TERMINAL:
                    self._observe(sub, t)
                    continue
                t._subs.append(sub)
                sub.pending += 1
                if t._sched is None or st is _CANCELLED:
                    self._register(t, fresh, fx)
            if priority is not None:
                for r in roots:
                    self._promote(r, priority, fx)
            for t in reversed(order):  # priority inheritance: producers are at least as urgent as consumers
                if t.state not in TERMINAL:
                    p = t._prio
                    for d in t._deps:
                        if d._prio > p and d.state not in TERMINAL:
                            self._promote(d, p, fx)
            for t in fresh:
                if t.state is _PENDING and t._waiting == 0:
                    self._make_ready(t, fx)
            if sub.failed and sub.fail_fast and not sub.cancel_requested:  # a root had already failed
                self._cancel_sub(sub, fx)
            elif sub.cancel_requested:
                self._cancel_sub(sub, fx, again=True)
        finally:
            sub.attaching = False
        if sub.pending == 0 and sub.state not in _DONE:
            self._complete_sub(sub, fx)

    def _check_attachable(self, t: Task) -> None:
        if t._sched is not None and t._sched is not self:
            raise ValueError(f"task {t.name!r} belongs to another scheduler")
        if t._sched is None and t.resource not in self._queues:
            raise ValueError(f"task {t.name!r} uses unknown resource {t.resource!r}; this scheduler has "
                             f"{', '.join(self._queues)}")

    def _revive(self, t: Task) -> None:
        t._transition(_PENDING)
        t.token = CancelToken(t.name)
        t.cause = None
        t._subs = []
        t._dependents = []
        for d in t._deps:  # edges from the previous life would count twice (test_properties found this)
            if d._dependents:
                d._dependents = [x for x in d._dependents if x is not t]

    def _register(self, t: Task, fresh: list[Task], fx: _Effects) -> None:
        """Register ``t``'s dependency edges (its dependencies were attached before it: post-order)."""
        t._sched = self
        t._queue = self._queues[t.resource]
        waiting = 0
        for d in t._deps:
            st = d.state
            if st is _SUCCEEDED:
                continue
            if st in TERMINAL:
                self._terminate(t, _CANCELLED if st is _CANCELLED else _SUPPRESSED, fx, cause=_root(d))
                return
            d._dependents.append(t)
            waiting += 1
        t._waiting = waiting
        fresh.append(t)

    # ************************************************************************************************
    # **** State changes (under the lock) ****

    def _make_ready(self, t: Task, fx: _Effects) -> None:
        t._transition(_READY)
        t._barrier = -1
        if self._trace is not None:
            t._t_ready = time.perf_counter()
        q = t._queue
        _enqueue(q.ready[t._prio], t)  # type: ignore[union-attr]
        t._where = IN_READY
        if not q.dirty:  # type: ignore[union-attr]
            q.dirty = True  # type: ignore[union-attr]
            fx.dirty.append(q)  # type: ignore[arg-type]

    def _succeed(self, t: Task, value: Any, fx: _Effects) -> None:
        """The one success path: SUCCEEDED with ``value``; dependents whose last dependency it was become
        ready; its submissions and callbacks hear of it. No cascade: success suppresses nothing."""
        t._value = value
        t._transition(_SUCCEEDED)
        t.fn = None  # drop what the body captured (caller-owned inputs) as soon as possible
        dependents = t._dependents
        if dependents:
            t._dependents = _NONE
            for d in dependents:
                if d.state is _PENDING:
                    d._waiting -= 1
                    if d._waiting == 0:
                        self._make_ready(d, fx)
        self._announce(t, fx)

    def _terminate(self, task: Task, state: TaskState, fx: _Effects, *, error: BaseException | None = None,
                   cause: Task | None = None) -> None:
        """Move ``task`` to FAILED, SUPPRESSED or CANCELLED and cascade: suppress or cancel its pending
        dependents (success goes through :meth:`_succeed`)."""
        work = [(task, state, error, cause)]
        done: list[Task] = []  # submissions hear about the whole cascade only after it (F1 before F2)
        while work:
            t, state, error, cause = work.pop()
            if t.state in TERMINAL:
                continue
            t._transition(state)
            t.error = error
            t.cause = cause
            if t._held:  # a queued task that was admitted and then cancelled
                self._admission.release(t)
            if t._seq:  # cancelled while it waited after a resume_after
                self._critical_ended(t, fx)
            t._where = IN_NONE
            if state is not _CANCELLED:  # a cancelled task keeps its body: C8 may revive it
                t.fn = None  # drop what the body captured (caller-owned inputs) as soon as possible
            dependents = t._dependents
            t._dependents = _NONE  # terminal tasks get no edges (revival gives it a list again)
            if dependents:
                dstate = _CANCELLED if state is _CANCELLED else _SUPPRESSED
                root = _root(t)
                for d in dependents:
                    if d.state is _PENDING:
                        work.append((d, dstate, None, root))
            done.append(t)
        for t in done:
            self._announce(t, fx)

    def _announce(self, t: Task, fx: _Effects) -> None:
        """Tell a task's submissions and callbacks that it reached a terminal state (once: both are cleared)."""
        subs = t._subs
        t._subs = _NONE
        for sub in subs:
            self._notify(sub, t, fx)
        if t._callbacks is not None:
            fx.callbacks.append((t._callbacks, t))
            t._callbacks = None

    def _notify(self, sub: _Submission, t: Task, fx: _Effects) -> None:
        sub.pending -= 1
        if t.state is not _SUCCEEDED:
            self._observe(sub, t)
            if sub.failed and sub.fail_fast and not sub.cancel_requested:
                self._cancel_sub(sub, fx)
        if sub.pending == 0 and not sub.attaching and sub.state not in _DONE:
            self._complete_sub(sub, fx)

    def _observe(self, sub: _Submission, t: Task) -> None:
        """Record a non-success outcome of a member in ``sub``'s tallies."""
        st = t.state
        if st is _CANCELLED:
            sub.n_cancelled += 1
            return
        if st is _FAILED:
            root = t
        elif st is _SUPPRESSED and t.cause is not None:
            root = t.cause
        else:
            return
        if not any(root is f for f in sub.failed):
            sub.failed.append(root)
            sub.errors.append(root.error)  # type: ignore[arg-type]

    def _cancel_sub(self, sub: _Submission, fx: _Effects, *, again: bool = False) -> None:
        """Drop ``sub``'s interest: tasks only it wants are cancelled, shared ones are released."""
        if sub.cancel_requested and not again:
            return
        sub.cancel_requested = True
        for t in tuple(sub.members):
            if t.state in TERMINAL or not any(s is sub for s in t._subs):
                continue
            if len(t._subs) > 1:
                t._subs.remove(sub)
                sub.pending -= 1
                sub.released.append(t)
            elif t.state is _RUNNING:
                t.token.cancelled = True  # joined: the submission waits for it to return
            else:
                self._terminate(t, _CANCELLED, fx)
        if sub.pending == 0 and not sub.attaching and sub.state not in _DONE:
            self._complete_sub(sub, fx)

    def _complete_sub(self, sub: _Submission, fx: _Effects) -> None:
        if sub.failed:
            st = HandleState.FAILED
        elif sub.n_cancelled or sub.released:
            st = HandleState.CANCELLED
        else:
            st = HandleState.SUCCEEDED
        sub._transition(st)
        if sub.n_cancelled:  # freeze: reviving a cancelled member (C8) must not rewrite this record
            sub.diagnostics = self._snapshot(sub)
        self._live.discard(sub)
        fx.subs.append(sub)

    def _promote(self, task: Task, prio: int, fx: _Effects) -> None:
        stack = [task]
        while stack:
            t = stack.pop()
            if t._prio <= prio or t.state in TERMINAL:
                continue
            t._prio = prio
            if t._where == IN_READY:  # the old entry goes stale (lazy invalidation)
                q = t._queue
                _enqueue(q.ready[prio], t)  # type: ignore[union-attr]
                if not q.dirty:  # type: ignore[union-attr]
                    q.dirty = True  # type: ignore[union-attr]
                    fx.dirty.append(q)  # type: ignore[arg-type]
            elif t._where == IN_WAIT:
                self._admission.park(t, prio)
            stack.extend(t._deps)

    def _resume(self, t: Task, producers: tuple[Task, ...], fx: _Effects) -> None:
        if t.token.cancelled:
            self._terminate(t, _CANCELLED, fx)
            return
        t._transition(_PENDING)
        t._deps.extend(producers)
        for sub in tuple(t._subs):
            self._attach(sub, producers, None, fx)
        if t.state is not _PENDING:  # attaching to a cancelled submission cancelled it
            return
        waiting = 0
        for p in producers:
            st = p.state
            if st is _SUCCEEDED:
                continue
            if st in TERMINAL:  # edges already registered go stale: dependents must be PENDING to count
                self._terminate(t, _CANCELLED if st is _CANCELLED else _SUPPRESSED, fx, cause=_root(p))
                return
            p._dependents.append(t)
            waiting += 1
            if p._prio > t._prio:
                self._promote(p, t._prio, fx)
        t._waiting = waiting
        if waiting == 0:
            self._make_ready(t, fx)

    # ************************************************************************************************
    # **** Dispatch (under the lock) ****

    def _drain_waitlist(self, fx: _Effects) -> None:
        """Put the memory-blocked tasks admission now admits back at the head of their ready queues."""
        for t, p in self._admission.drain():
            q = t._queue
            q.ready[p].appendleft(t)  # type: ignore[union-attr]
            if not q.dirty:  # type: ignore[union-attr]
                q.dirty = True  # type: ignore[union-attr]
                fx.dirty.append(q)  # type: ignore[arg-type]

    def _pick(self, q: _ResourceQueue) -> Task | None:
        for p in range(3):
            if p and q.noncritical >= q.noncritical_limit:
                return None
            dq = q.ready[p]
            while dq:
                t = dq[0]
                if t.state is not _READY or t._where != IN_READY or t._prio != p:
                    dq.popleft()  # stale: cancelled, promoted, or moved to the memory waitlist
                    continue
                if p == 2 and self._critical and not t._held:  # S2: background work waits behind critical
                    if t._barrier < 0:
                        t._barrier = self._crit_seq
                        return None
                    if min(self._critical) <= t._barrier:
                        return None
                if t._charge and not t._held and not self._admission.admit(t, p):
                    dq.popleft()
                    self._admission.park(t, p)
                    continue
                dq.popleft()
                return t
        return None

    def _dispatch(self, fx: _Effects, own: _ResourceQueue | None) -> Task | None:
        """Give free slots to admitted ready tasks; return the next task for the calling ``own`` worker."""
        w = self._admission.waiting
        if w[0] or w[1] or w[2]:
            self._drain_waitlist(fx)
        nxt = None
        dirty = fx.dirty
        i = 0
        while i < len(dirty):
            q = dirty[i]
            i += 1
            q.dirty = False
            while q.running < q.slots:
                t = self._pick(q)
                if t is None:
                    break
                t._transition(_RUNNING)
                t._where = IN_NONE
                q.running += 1
                if t._prio:
                    q.noncritical += 1
                    t._noncritical = True
                else:
                    t._noncritical = False
                    if not t._seq:  # a resumed segment keeps the number of its first
                        self._crit_seq += 1
                        t._seq = self._crit_seq
                        self._critical.add(t._seq)
                if self._audit is not None:
                    self._audit(t, q)
                if q is own and nxt is None:
                    nxt = t
                elif q.pool is None:
                    fx.inline.append(t)
                else:
                    fx.starts.append(t)
        dirty.clear()
        return nxt

    # ************************************************************************************************
    # **** Running tasks (no lock held) ****

    def _run(self, t: Task) -> tuple[int, Any]:
        tr = self._trace
        t0 = time.perf_counter() if tr is not None else 0.0
        t.runs += 1
        cur = _current
        outer = getattr(cur, "token", None)  # an inline task runs inside its caller's task
        cur.token = t.token  # checkpoint() in long kernels sees this task's cancellation
        try:
            r = t.fn(t)  # type: ignore[misc]
            outcome = _RESUME if r.__class__ is Resume else _OK
            payload = r.producers if outcome == _RESUME else r
        except Cancelled:
            outcome, payload = _CANCEL, None
        except BaseException as e:
            outcome, payload = _FAIL, e
        finally:
            cur.token = outer
        if tr is not None:
            tr._add(t.name, t.resource, t._prio, t._charge, t._t_ready or t0, t0, time.perf_counter(),
                    _OUTCOME[outcome])
        return outcome, payload

    def _finish(self, t: Task, outcome: int, payload: Any, q: _ResourceQueue, fx: _Effects,
                own: _ResourceQueue | None) -> Task | None:
        """Complete one run segment of ``t`` (under the lock); returns the worker's next task."""
        q.running -= 1
        if t._noncritical:
            q.noncritical -= 1
        if t._held:
            self._admission.release(t)
        if outcome == _OK:
            self._succeed(t, payload, fx)
        elif outcome == _FAIL:
            self._terminate(t, _FAILED, fx, error=payload)
        elif outcome == _CANCEL:
            self._terminate(t, _CANCELLED, fx)
        else:
            self._resume(t, payload, fx)
        if t._seq and outcome != _RESUME:
            self._critical_ended(t, fx)
        if not q.dirty:
            q.dirty = True
            fx.dirty.append(q)
        return self._dispatch(fx, own)

    def _critical_ended(self, t: Task, fx: _Effects) -> None:
        """``t`` was critical work in flight (S2's background barrier) and is terminal now: it yielded
        (resume_after) without leaving the set, so a continuation waiting for a read still holds it."""
        seq, t._seq = t._seq, 0
        self._critical.discard(seq)
        if not self._critical or min(self._critical) > seq:  # a held background task's barrier may have passed
            for bq in self._queues.values():
                if bq.ready[2] and not bq.dirty:
                    bq.dirty = True
                    fx.dirty.append(bq)

    def _drain(self, t: Task | None) -> None:
        """Pool job: run tasks of one resource back to back while it has admitted work."""
        q = t._queue  # type: ignore[union-attr]
        outcome, payload = self._run(t)  # first, before any allocation: submit-to-start latency
        fx = _Effects()
        lock = self._lock
        while t is not None:
            with lock:
                t = self._finish(t, outcome, payload, q, fx, q)  # type: ignore[arg-type]
            if fx.starts or fx.subs or fx.callbacks or fx.inline:
                self._after(fx)  # leaves fx empty for reuse
            if t is not None:
                outcome, payload = self._run(t)

    def _after(self, fx: _Effects) -> None:
        """Outside the lock: wake workers, call callbacks, finish submissions, run inline tasks.

        Leaves ``fx`` empty, so callers may reuse it.
        """
        inline: deque[Task] | None = None
        while True:
            if fx.starts:
                for t in fx.starts:
                    t._queue.pool.submit(self._drain, t)  # type: ignore[union-attr]
                fx.starts.clear()
            if fx.callbacks:  # before submissions complete: wait() returns after them
                for cbs, t in fx.callbacks:
                    for cb in cbs:
                        _call_logged(cb, t)
                fx.callbacks.clear()
            if fx.subs:
                for sub in fx.subs:
                    self._finalize(sub)
                fx.subs.clear()
            if fx.inline:
                if inline is None:
                    inline = deque()
                inline.extend(fx.inline)
                fx.inline.clear()
            if not inline:
                return
            t = inline.popleft()
            outcome, payload = self._run(t)
            with self._lock:
                self._finish(t, outcome, payload, self._inline, fx, None)

    def _finalize(self, sub: _Submission) -> None:
        sub.keepalive = None
        sub.done.set()
        cbs = sub.callbacks
        sub.callbacks = []
        for cb in cbs:
            _call_logged(cb)


def _enqueue(dq: deque[Task], t: Task) -> None:
    """Queue a ready task in its class (S2): unranked at the back; ranked before the ranked tasks at the
    back that rank higher, but never ahead of an unranked one (stale entries are passed like live ones)."""
    r = t.rank
    i = n = len(dq)
    if r is not None:
        while i and (o := dq[i - 1].rank) is not None and o > r:
            i -= 1
    if i == n:
        dq.append(t)
    else:
        dq.insert(i, t)


def _root(t: Task) -> Task:
    """The task a failure or cancellation of ``t``'s dependents is attributed to."""
    if t.state is _FAILED or t.cause is None:
        return t
    return t.cause


def _call_logged(cb: Callable[..., Any], *args: Any) -> None:
    try:
        cb(*args)
    except Exception:
        _log().exception("callback %r raised", cb)

