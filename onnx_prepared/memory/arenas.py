"""The session's arenas, one per :class:`~onnx_prepared.memory.Domain`: live and retained byte accounting.

numpy owns the actual buffers; an arena is the ledger that says which domain owns how many bytes,
so budgets can be trusted. Counters change in exactly two pairs of places: :meth:`Arena.acquire` and
:meth:`Allocation.release` (:meth:`Allocation.transfer` moves already-charged bytes between domains), and
:meth:`Arena.hold` / :meth:`Arena.unhold`, the same charge with no :class:`Allocation` for a caller that
returns it itself in a ``finally`` (the hot run: an Allocation and its tag cost ~4 us a run, more than
the rest of the hot path's bookkeeping together).
Freed capacity is *retained* (as an allocator would keep it) up to the arena's ``retention_cap`` and
trimmed beyond it; an acquire reuses retained capacity first.

Limits are real: an acquisition past an arena's limit raises :class:`ArenaLimitError` naming the arena,
the allocation and the bytes. Work that may wait for memory waits *before* it allocates, in admission
(the scheduler's, or the residency budget's for prepared objects), never inside an arena.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from onnx_prepared.errors import InternalError, OnnxPreparedError
from onnx_prepared.memory.domains import Domain
from onnx_prepared.records import field, record


class ArenaLimitError(OnnxPreparedError, MemoryError):
    """An allocation would exceed an arena's limit."""


@record(eq=False)
class Allocation:
    """Bytes charged to one arena until :meth:`release` (idempotent) returns them."""

    arena: Arena
    nbytes: int
    tag: str = ""
    released: bool = field(default=False, repr=False)

    def release(self) -> None:
        """Return the bytes to the arena. Thread-safe; a second call is a no-op."""
        self.arena._release(self)

    def transfer(self, arena: Arena, tag: str | None = None) -> Allocation:
        """Hand these bytes to another arena (e.g. a read buffer that becomes a published object).

        Not an acquisition: the bytes already exist and were admitted once, so the target's limit is
        not checked again (the process holds no more memory than before the hand-off).
        """
        new = arena._charge(self.nbytes, tag if tag is not None else self.tag)
        self.release()
        return new


class Arena:
    """One memory domain: ``limit`` caps live bytes; ``retention_cap`` caps retained free bytes."""

    def __init__(self, name: str, limit: int | None = None, retention_cap: int | None = None) -> None:
        self.name = name
        self.limit = limit
        self.retention_cap = retention_cap
        self._lock = threading.Lock()
        # invariant: live == sum(a.nbytes for unreleased allocations of this arena)
        self.live = 0
        self.retained = 0
        self.peak_live = 0
        self.allocations = 0

    def acquire(self, nbytes: int, tag: str = "", *, force: bool = False) -> Allocation:
        """Charge ``nbytes``; raises :class:`ArenaLimitError` past the limit. Thread-safe.

        ``force`` skips the limit check; only tests use it (production work waits in admission first).
        """
        if nbytes < 0:
            raise InternalError(f"negative allocation of {nbytes} bytes in {self.name}")
        if not force and self.limit is not None:
            with self._lock:
                if self.live + nbytes > self.limit:
                    raise ArenaLimitError(
                        f"{self.name}: {nbytes} bytes for {tag or 'an allocation'} would exceed the limit "
                        f"({self.live} live of {self.limit})"
                    )
        return self._charge(nbytes, tag)

    def hold(self, nbytes: int, tag: Callable[[], str]) -> None:
        """:meth:`acquire` without an Allocation: the caller owes one :meth:`unhold` of ``nbytes``.

        ``tag`` is called only for the error message (formatting it costs more than the charge)."""
        with self._lock:
            if self.limit is not None and self.live + nbytes > self.limit:
                raise ArenaLimitError(f"{self.name}: {nbytes} bytes for {tag()} would exceed the limit "
                                      f"({self.live} live of {self.limit})")
            self._add_live(nbytes)

    def unhold(self, nbytes: int) -> None:
        """Return the bytes of one :meth:`hold` (exactly once: there is no Allocation to make it idempotent)."""
        with self._lock:
            self._sub_live(nbytes)

    def _add_live(self, nbytes: int) -> None:  # the lock held: the one place bytes become live
        self.live += nbytes
        self.retained -= min(self.retained, nbytes)
        if self.live > self.peak_live:
            self.peak_live = self.live
        self.allocations += 1

    def _sub_live(self, nbytes: int) -> None:  # the lock held: the one place live bytes are returned
        self.live -= nbytes
        self.retained += nbytes
        if self.retention_cap is not None and self.retained > self.retention_cap:
            self.retained = self.retention_cap

    def _charge(self, nbytes: int, tag: str) -> Allocation:
        with self._lock:
            self._add_live(nbytes)
        return Allocation(self, nbytes, tag)

    def _release(self, a: Allocation) -> None:
        if a.arena is not self:
            raise InternalError("allocation released into a foreign arena")
        with self._lock:
            if a.released:
                return
            a.released = True
            self._sub_live(a.nbytes)

    def trim(self) -> int:
        """Drop all retained capacity; returns the bytes trimmed."""
        with self._lock:
            n, self.retained = self.retained, 0
        return n

    @property
    def reserved(self) -> int:
        """Live plus retained bytes: what this domain holds from the process's point of view."""
        return self.live + self.retained

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"live": self.live, "retained": self.retained, "peak_live": self.peak_live}

    def __repr__(self) -> str:
        lim = "unlimited" if self.limit is None else f"limit={self.limit}"
        return f"<Arena {self.name} live={self.live} retained={self.retained} {lim}>"


_NAMES = {Domain.PREPARATION: "PreparationArena", Domain.PREPARED: "PreparedArena",
          Domain.EXECUTION: "ExecutionArena", Domain.IO: "IOArena"}
_MEMBERS = tuple((d, d.value, _NAMES[d]) for d in Domain)  # (member, its value, its arena's name)


@record
class Arenas:
    """The session's four domains: PreparationArena, PreparedArena, ExecutionArena, IOArena.

    Indexed by :class:`~onnx_prepared.memory.Domain` (or its value: ``arenas["prepared"]``).
    """

    preparation: Arena
    prepared: Arena
    execution: Arena
    io: Arena

    @classmethod
    def create(
        cls,
        *,
        prepared_limit: int | None = None,
        limits: dict[str, int | None] | None = None,
        retention_caps: dict[str, int | None] | None = None,
    ) -> Arenas:
        """Keys of ``limits`` and ``retention_caps`` are domains or their values ("execution")."""
        limits = {Domain(k): v for k, v in limits.items()} if limits else {}
        if prepared_limit is not None:
            limits[Domain.PREPARED] = prepared_limit
        caps = {Domain(k): v for k, v in retention_caps.items()} if retention_caps else {}
        # (the members and their values listed once: an enum iteration and .value reads cost ~1 us each)
        return cls(**{value: Arena(name, limits.get(d), caps.get(d)) for d, value, name in _MEMBERS})

    def __getitem__(self, domain: Domain | str) -> Arena:
        return getattr(self, Domain(domain).value)

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {d.value: self[d].snapshot() for d in Domain}
