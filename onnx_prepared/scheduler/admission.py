"""Memory admission: a task's estimate is charged to the budget before it may take a slot.

Rule S1/S2 of :mod:`onnx_prepared.scheduler`: a task with a charge runs only once the
:class:`~onnx_prepared.memory.MemoryBudget` admits it (critical work may use the critical reserve); a task
that does not fit waits in its priority class's FIFO list, and nobody as urgent or less overtakes a
waiting task. The charge is released when the task completes, except bytes it hands to a
:class:`~onnx_prepared.scheduler.estimates.MemoryLease` (``task.retain``), which their owner releases.

Not thread-safe: the RuntimeScheduler calls every method under its lock, decides there, and acts
(starts workers, runs callbacks) after releasing it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from onnx_prepared.memory import Domain, MemoryBudget
from onnx_prepared.scheduler.task import IN_READY, IN_WAIT, Task, TaskState

_READY = TaskState.READY


class Admission:
    """The budget and the memory waitlist (one deque per priority class)."""

    __slots__ = ("budget", "waiting")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.waiting: tuple[deque[Task], deque[Task], deque[Task]] = (deque(), deque(), deque())

    def __len__(self) -> int:
        """Entries on the waitlist (stale ones included until they reach a head)."""
        w = self.waiting
        return len(w[0]) + len(w[1]) + len(w[2])

    def head(self, p: int) -> Task | None:
        """The first live waiter of class ``p`` (stale entries are dropped lazily)."""
        dq = self.waiting[p]
        while dq:
            t = dq[0]
            if t.state is _READY and t._where == IN_WAIT and t._prio == p:
                return t
            dq.popleft()
        return None

    def admit(self, t: Task, p: int) -> bool:
        """Charge ``t`` now if it fits and no waiter of class ``p`` or more urgent is ahead of it."""
        for hp in range(p + 1):  # FIFO fairness: nobody overtakes a waiting task as urgent or more
            if self.waiting[hp] and self.head(hp) is not None:
                return False
        return self._charge(t, p)

    def park(self, t: Task, p: int) -> None:
        """``t`` did not fit: it waits in class ``p`` (also used when a waiter is promoted)."""
        t._where = IN_WAIT
        self.waiting[p].append(t)

    def drain(self) -> Iterator[tuple[Task, int]]:
        """Admit waiters in priority order, yielding each ``(task, class)``; a blocked head blocks every
        less urgent class."""
        for p in range(3):
            while True:
                t = self.head(p)
                if t is None:
                    break
                if not self._charge(t, p):
                    return
                self.waiting[p].popleft()
                t._where = IN_READY
                yield t, p

    def release(self, t: Task) -> None:
        """Return what ``t`` still holds (it completed, or was cancelled after admission)."""
        if t._held:
            self.budget.release(t.memory.domain, t._held)
            t._held = 0

    def retain(self, t: Task, nbytes: int) -> None:
        """Move ``nbytes`` of a running task's charge out of the task, into the caller's lease."""
        if nbytes < 0 or nbytes > t._held:
            raise ValueError(f"task {t.name!r} cannot retain {nbytes} bytes: it holds {t._held}")
        t._held -= nbytes

    def release_lease(self, domain: Domain, nbytes: int) -> None:
        """A lease's owner returned its bytes."""
        self.budget.release(domain, nbytes)

    def _charge(self, t: Task, p: int) -> bool:
        b = self.budget
        if not b.fits(t.memory.domain, t._charge, p == 0):
            return False
        b.acquire(t.memory.domain, t._charge, p == 0)
        t._held = t._charge
        return True
