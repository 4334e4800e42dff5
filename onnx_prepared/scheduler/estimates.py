"""Per-task memory estimates, and leases for bytes a task hands to the owner of what it published.

The domains and the budget they are charged to live in :mod:`onnx_prepared.memory`; admission (which
charges and releases the budget) in :mod:`onnx_prepared.scheduler.admission`.
"""

from __future__ import annotations

from typing import Any

from onnx_prepared.memory import Domain
from onnx_prepared.records import record


@record(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes a task needs, charged to ``domain`` before it is dispatched.

    The charge is ``output + temp``: what the task brings into memory. ``input`` bytes already exist
    and belong to whoever produced them (usually a :class:`MemoryLease`), so they are recorded for
    traces and diagnostics but not charged twice.
    """

    domain: Domain = Domain.EXECUTION
    input: int = 0
    output: int = 0
    temp: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.domain, Domain):
            raise ValueError(f"memory domain must be a Domain, got {self.domain!r}")
        for name in ("input", "output", "temp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"memory estimate {name} must be a non-negative int, got {v!r}")

    @property
    def charge(self) -> int:
        return self.output + self.temp


NO_MEMORY = MemoryEstimate()


class MemoryLease:
    """Bytes a task handed to the owner of the object it published; released once by that owner.

    Created by ``task.retain(nbytes)`` inside a running task. The scheduler keeps those bytes
    charged to the task's domain after the task completes, until :meth:`release` (idempotent,
    thread-safe) returns them and wakes any task waiting for memory.
    """

    __slots__ = ("_released", "_scheduler", "domain", "nbytes")

    def __init__(self, scheduler: Any, domain: Domain, nbytes: int):  # the RuntimeScheduler (a layer above)
        self._scheduler = scheduler
        self.domain = domain
        self.nbytes = nbytes
        self._released = False  # written only under the scheduler lock

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        self._scheduler._release_lease(self)

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<MemoryLease {self.nbytes} bytes of {self.domain.value} {state}>"
