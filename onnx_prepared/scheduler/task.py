"""Task: one schedulable unit of work, with its state machine, priority, resource class and cancel token.

A task is created unattached, then attached to a scheduler by the first submission that wants it. All
mutable fields are written only by the scheduler under its lock; ``state`` only by :meth:`Task._transition`.
Inside its body (``fn(task)``) a task may read ``task.token``, ``task.dependencies`` and their results,
call :meth:`Task.retain` to hand bytes to the owner of what it publishes, and return
:meth:`Task.resume_after` to yield until a producer completes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from enum import Enum, IntEnum
from typing import Any

from onnx_prepared.errors import Cancelled, InternalError
from onnx_prepared.scheduler.estimates import NO_MEMORY, MemoryEstimate, MemoryLease


class Priority(IntEnum):
    """Scheduling class; a lower value is more urgent."""

    CRITICAL = 0  # inference, and any producer chain an inference is waiting for
    PREFETCH = 1  # preparation inside the look-ahead window
    BACKGROUND = 2  # preparation outside the window, cache writes, optional variants

    def __str__(self) -> str:
        return self.name


class Resource(str, Enum):
    """Resource classes; devices are ``Resource.device(name)`` (a plain ``"device:<name>"`` string)."""

    IO = "io"  # bounded I/O workers: external-data and cache reads/writes
    CPU = "cpu"  # the session CpuExecutor: transforms, packing, CPU kernels
    INLINE = "inline"  # trivial work: runs on the thread that made it ready, no worker wake-up

    @staticmethod
    def device(name: str) -> str:
        return f"device:{name}"


class TaskState(IntEnum):
    PENDING = 0  # waiting for dependencies (or not yet submitted)
    READY = 1  # dependencies succeeded; queued for a slot and memory
    RUNNING = 2  # holds a slot (and its memory charge)
    SUCCEEDED = 3
    FAILED = 4  # its body raised
    SUPPRESSED = 5  # never ran: a dependency failed (``cause`` names the failed task)
    CANCELLED = 6  # never ran, or raised Cancelled after cancellation; revivable (C8)

    def __str__(self) -> str:
        return self.name


S = TaskState
_ALLOWED: dict[TaskState, frozenset[TaskState]] = {
    S.PENDING: frozenset({S.READY, S.SUPPRESSED, S.CANCELLED}),
    S.READY: frozenset({S.RUNNING, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PENDING}),  # PENDING: resume_after
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.SUPPRESSED: frozenset(),
    # Revived when a later submission wants it: it never started, or raised Cancelled; either way its
    # effect did not happen, so running it again is safe (C8).
    S.CANCELLED: frozenset({S.PENDING}),
}
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.SUPPRESSED, S.CANCELLED})

# Where a READY task is queued (lazy invalidation: stale queue entries are skipped when reached).
IN_NONE, IN_READY, IN_WAIT = 0, 1, 2


class CancelToken:
    """Cooperative cancellation flag of one task. Level-triggered: once set it stays set."""

    __slots__ = ("_name", "cancelled")

    def __init__(self, name: str):
        self._name = name
        self.cancelled = False

    def check(self) -> None:
        """Raise :class:`Cancelled` if cancellation was requested (a checkpoint)."""
        if self.cancelled:
            raise Cancelled(f"task {self._name!r} was cancelled")


_current = threading.local()  # .token: the CancelToken of the task body running on this thread


def checkpoint() -> None:
    """Raise :class:`Cancelled` if the task running on this thread was cancelled; a no-op elsewhere.

    For loops inside one task body that the scheduler cannot interrupt (Loop/Scan bodies, long
    fallback ops): call it once per iteration. Costs one thread-local read.
    """
    token = getattr(_current, "token", None)
    if token is not None and token.cancelled:
        token.check()


class Resume:
    """Returned by a task body to suspend until ``producers`` complete (see :meth:`Task.resume_after`)."""

    __slots__ = ("producers",)

    def __init__(self, producers: tuple[Task, ...]):
        self.producers = producers


def _check_task(x: object) -> Task:
    if x.__class__ is not Task:
        raise TypeError(f"expected a Task, got {type(x).__name__}")
    return x  # type: ignore[return-value]


class Task:
    """One unit of work: ``fn(task)`` runs on ``resource`` once its dependencies succeeded.

    >>> read = Task(lambda t: f.read(), resource=Resource.IO, priority=Priority.PREFETCH,
    ...             memory=MemoryEstimate(Domain.PREPARATION, output=nbytes), name="read W0")
    >>> pack = Task(lambda t: prepack(read.result), deps=[read], name="prepack W0")

    A succeeded, failed or suppressed task never runs again (a retry is a new task, a new generation);
    a cancelled one is revived if a later submission wants it.
    """

    __slots__ = (
        "_barrier",
        "_callbacks",
        "_charge",
        "_dependents",
        "_deps",
        "_held",
        "_noncritical",
        "_prio",
        "_queue",
        "_sched",
        "_seq",
        "_subs",
        "_t_ready",
        "_value",
        "_waiting",
        "_where",
        "cause",
        "error",
        "fn",
        "memory",
        "name",
        "rank",
        "resource",
        "runs",
        "state",
        "token",
    )

    def __init__(
        self,
        fn: Callable[[Task], Any],
        *,
        deps: Iterable[Task] = (),
        resource: Resource | str = Resource.CPU,
        priority: Priority | int = Priority.CRITICAL,
        memory: MemoryEstimate = NO_MEMORY,
        name: str | None = None,
        rank: int | None = None,
    ):
        self.fn: Callable[[Task], Any] | None = fn  # dropped at the terminal state (frees captured inputs)
        self.name = name if name is not None else getattr(fn, "__name__", "task")
        if resource.__class__ is not str:
            resource = resource.value if isinstance(resource, Resource) else str(resource)
        self.resource: str = resource  # type: ignore[assignment]
        self._prio = int(priority)
        if not 0 <= self._prio <= 2:
            raise ValueError(f"priority must be a Priority, got {priority!r}")
        self._deps: list[Task] = list(deps)  # grows only by resume_after
        for d in self._deps:
            if d.__class__ is not Task:
                _check_task(d)
        self.memory = memory
        #: order among the ready tasks of its priority class (S2: lower first, FIFO among equal ranks; an
        #: unranked task is FIFO and never overtaken by a ranked one queued after it). The cold path ranks
        #: session tasks by when inference first needs their object, so a free preparation slot takes the
        #: object needed next, not the one whose read happened to finish first.
        self.rank = rank
        self._charge = memory.output + memory.temp
        self.token = CancelToken(self.name)
        self.state = S.PENDING  # written only by _transition
        self._value: Any = None
        self.error: BaseException | None = None  # set when FAILED
        self.cause: Task | None = None  # SUPPRESSED: the failed task; CANCELLED: the cancelled root
        self.runs = 0  # body executions (resume_after makes more than one)
        # Scheduler bookkeeping, all guarded by the scheduler lock:
        # NOTE: typed Any: the scheduler's layers run runtime -> handle -> task (import-linter), so a
        # task does not import the RuntimeScheduler, its queues or the handle's _Submission.
        self._sched: Any = None  # the RuntimeScheduler; set once, at first attach
        self._queue: Any = None  # its _ResourceQueue for this task's resource
        self._subs: list[Any] = []  # live _Submissions that want this task (interest)
        self._dependents: list[Task] = []  # attached tasks waiting on this one
        self._waiting = 0  # dependencies not yet succeeded
        self._where = IN_NONE
        self._held = 0  # bytes currently charged to this task (not yet released or leased)
        self._noncritical = False  # dispatched into a non-critical slot
        self._seq = 0  # critical: its dispatch number while running (the S2 background barrier counts them)
        self._barrier = -1  # background: the last critical dispatch before it was first held (-1: never)
        self._callbacks: list[Callable[[Task], Any]] | None = None
        self._t_ready = 0.0

    # **** state machine ****

    def _transition(self, new: TaskState) -> None:
        if new not in _ALLOWED[self.state]:
            raise InternalError(f"illegal task transition {self.state.name} -> {new.name} for {self!r}")
        self.state = new

    # **** read-only views ****

    @property
    def priority(self) -> Priority:
        return Priority(self._prio)

    @property
    def dependencies(self) -> tuple[Task, ...]:
        return tuple(self._deps)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def result(self) -> Any:
        """The body's return value (only once SUCCEEDED)."""
        if self.state is not S.SUCCEEDED:
            raise RuntimeError(f"task {self.name!r} has no result: it is {self.state.name}")
        return self._value

    # **** called from inside the running body ****

    def resume_after(self, *producers: Task) -> Resume:
        """Suspend this task until every producer succeeded, then run its body again (once).

        Use as ``return task.resume_after(producer)``. The producers join every submission that
        wants this task and inherit its priority; the task's memory charge is released while it
        waits and admitted again before it resumes. A producer that fails suppresses this task.
        """
        if self.state is not S.RUNNING:
            raise RuntimeError(f"resume_after() is only valid inside the running body of {self.name!r}")
        if not producers:
            raise ValueError("resume_after() needs at least one producer task")
        return Resume(tuple(_check_task(p) for p in producers))

    def retain(self, nbytes: int | None = None) -> MemoryLease:
        """Hand ``nbytes`` of this task's charge (default: its output estimate) to a lease.

        The scheduler then keeps those bytes charged after the task completes, until the lease's
        owner (the object the task publishes) calls ``lease.release()``.
        """
        if self.state is not S.RUNNING or self._sched is None:
            raise RuntimeError(f"retain() is only valid inside the running body of {self.name!r}")
        return self._sched._retain(self, self.memory.output if nbytes is None else nbytes)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} {self.state.name} {self.resource} {Priority(self._prio).name.lower()}>"
