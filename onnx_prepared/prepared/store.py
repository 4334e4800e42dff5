"""PreparedObjectStore: the residency state machine of every prepared object of a session.

::

    absent -> loading -> preparing -> resident -> evicting -> absent
                 |           |
                 +-------> failed -> loading (a new generation retries)

Each key has one entry, the record of its current *generation* (each production attempt is a new one):
its state, the task producing it (whose completion is the generation's: consumers wait on that task,
there is no second completion event), the bytes residency admitted for it while in flight, the published
value with its PreparedArena allocation (the object's lease on that memory, released by the store on
eviction), and the companion entry this session persisted it to (where a restore reads). The shared
source reads a generation consumes are registered here too (:class:`ReadEntry`, one per source name,
shared by the layouts of one tensor). The store is the only writer of all of it. Consumers of one key
share the in-flight generation (one read, one prepack), wait on its producing task, and pin the resident
object while they use it (:meth:`try_pin`: the value, or None in the normal race with eviction or
production). Eviction removes residency, not identity.

Every state change goes through ``_transition`` under the one lock, against ``_ALLOWED`` (an Enum plus
one transition function: keep it that way; callers decide under the lock and act outside it).

The *readiness epoch*: ``epoch`` increases on every event that makes a previously resident object
unavailable (eviction, failure). ``hot_epoch`` equals ``epoch`` exactly while every required object
is resident, so a run decides hot vs cold with one integer comparison.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from typing import Any

from onnx_prepared.errors import InternalError
from onnx_prepared.memory import Allocation
from onnx_prepared.records import record


class EntryState(enum.Enum):
    ABSENT = "absent"
    LOADING = "loading"
    PREPARING = "preparing"
    RESIDENT = "resident"
    FAILED = "failed"
    EVICTING = "evicting"


_ALLOWED: dict[EntryState, frozenset[EntryState]] = {
    EntryState.ABSENT: frozenset({EntryState.LOADING}),
    EntryState.LOADING: frozenset({EntryState.PREPARING, EntryState.RESIDENT, EntryState.FAILED, EntryState.ABSENT}),
    EntryState.PREPARING: frozenset({EntryState.RESIDENT, EntryState.FAILED, EntryState.ABSENT}),
    EntryState.RESIDENT: frozenset({EntryState.EVICTING}),
    EntryState.EVICTING: frozenset({EntryState.ABSENT, EntryState.RESIDENT}),
    EntryState.FAILED: frozenset({EntryState.LOADING}),
}

@record(eq=False)
class ReadEntry:
    """One in-flight or buffered read of a source payload, shared by the generations attached to it.

    invariant: the buffer is released exactly when ``users`` drops to 0 after the read completed.
    """

    name: str
    users: int = 0  # productions attached and not yet finished
    value: Any = None
    allocation: Allocation | None = None
    task: Any = None  # the scheduler's task for this read (the session layer's business)


@record(eq=False)
class PreparedEntry:
    """The generation record of one key. Written only by :class:`PreparedObjectStore`, under its lock."""

    key: Any
    state: EntryState = EntryState.ABSENT
    generation: int = 0
    value: Any = None  # invariant: not None iff state is RESIDENT or EVICTING
    allocation: Allocation | None = None  # the published object's PreparedArena bytes: its lease
    nbytes: int = 0
    pins: int = 0  # invariant: > 0 only while RESIDENT (or EVICTING refused)
    error: BaseException | None = None
    # the task publishing the current generation (kept after it finished): its completion is the
    # generation's completion, the one event consumers wait on (the scheduler's resume_after)
    producer: Any = None
    reserved: int | None = None  # bytes residency admitted for the in-flight generation (None: none)
    last_use: int = 0
    # the companion entry this session persisted the object to (its restore is one packed read), or None
    persisted: Any = None

    def __repr__(self) -> str:
        return f"<PreparedEntry {self.key} {self.state.value} gen={self.generation} pins={self.pins}>"


class PreparedObjectStore:
    """Registry of prepared objects; all methods are thread-safe (one lock)."""

    def __init__(self, keys: Iterable[Any]) -> None:
        self._lock = threading.Lock()
        self._entries = {k: PreparedEntry(k) for k in keys}
        self._reads: dict[str, ReadEntry] = {}  # source name -> its current shared read
        self._resident = 0
        self.epoch = 0
        self.hot_epoch = -1 if self._entries else 0
        self.leases = 0  # run-level pins of the whole resident generation (hot path)
        self.counters = {"claims": 0, "productions": 0, "shared": 0, "published": 0, "evicted": 0, "failed": 0}

    # ---- state machine ----
    def _transition(self, e: PreparedEntry, new: EntryState) -> None:
        if new not in _ALLOWED[e.state]:
            raise InternalError(f"prepared object {e.key}: illegal transition {e.state.value} -> {new.value}")
        was_resident = e.state is EntryState.RESIDENT
        e.state = new
        if new is EntryState.RESIDENT and not was_resident:
            self._resident += 1
            if self._resident == len(self._entries):
                self.hot_epoch = self.epoch
        elif was_resident and new is not EntryState.RESIDENT:
            self._resident -= 1
            self.epoch += 1  # invalidates the readiness epoch

    def entry(self, key: Any) -> PreparedEntry:
        return self._entries[key]

    @property
    def all_resident(self) -> bool:
        return self.hot_epoch == self.epoch

    # ---- production ----
    def claim(self, key: Any) -> tuple[int, bool]:
        """Join or start a generation: returns (generation, caller_must_produce)."""
        with self._lock:
            e = self._entries[key]
            self.counters["claims"] += 1
            if e.state in (EntryState.ABSENT, EntryState.FAILED):
                self._transition(e, EntryState.LOADING)
                e.generation += 1
                e.error = None
                e.producer = None
                self.counters["productions"] += 1
                return e.generation, True
            self.counters["shared"] += 1
            return e.generation, False

    def mark_preparing(self, key: Any, generation: int) -> None:
        with self._lock:
            e = self._entries[key]
            self._check_gen(e, generation)
            self._transition(e, EntryState.PREPARING)

    def publish(self, key: Any, generation: int, value: Any, nbytes: int, allocation: Allocation | None = None) -> None:
        """Make ``value`` resident; ``allocation`` (its PreparedArena bytes) is now the store's to release."""
        with self._lock:
            e = self._entries[key]
            self._check_gen(e, generation)
            e.value, e.nbytes, e.allocation = value, nbytes, allocation
            self._transition(e, EntryState.RESIDENT)
            self.counters["published"] += 1

    def fail(self, key: Any, generation: int, error: BaseException) -> None:
        """Record a failed generation (consumers see the error through its producer task); a later claim
        starts a new generation."""
        with self._lock:
            e = self._entries[key]
            if e.generation != generation or e.state not in (EntryState.LOADING, EntryState.PREPARING):
                return
            e.error = error
            self._transition(e, EntryState.FAILED)
            self.counters["failed"] += 1

    def abandon(self, key: Any, generation: int) -> None:
        """A generation was cancelled before publishing: back to absent (no error recorded)."""
        with self._lock:
            e = self._entries[key]
            if e.generation != generation or e.state not in (EntryState.LOADING, EntryState.PREPARING):
                return
            self._transition(e, EntryState.ABSENT)

    def set_producer(self, key: Any, generation: int, task: Any) -> None:
        """Record the task that produces ``generation`` (the caller claimed it)."""
        with self._lock:
            e = self._entries[key]
            self._check_gen(e, generation)
            e.producer = task

    def producer(self, key: Any) -> Any:
        """The task producing the in-flight generation, or None when none is in flight."""
        e = self._entries[key]
        return e.producer if e.state in (EntryState.LOADING, EntryState.PREPARING) else None

    def set_persisted(self, key: Any, entry: Any) -> None:
        """This session wrote ``key`` to the companion model as ``entry``: later generations restore it."""
        with self._lock:
            self._entries[key].persisted = entry

    def persisted(self, key: Any) -> Any:
        """The companion entry this session persisted ``key`` to, or None."""
        return self._entries[key].persisted

    # ---- in-flight residency (what the residency policy admitted for a production) ----
    def reserve(self, key: Any, nbytes: int) -> bool:
        """Record ``nbytes`` admitted for producing ``key``; False if a reservation already exists."""
        with self._lock:
            e = self._entries[key]
            if e.reserved is not None:
                return False
            e.reserved = nbytes
            return True

    def is_reserved(self, key: Any) -> bool:
        return self._entries[key].reserved is not None

    def settle(self, key: Any) -> None:
        """The production of ``key`` ended (published, failed or cancelled): drop its reservation."""
        with self._lock:
            self._entries[key].reserved = None

    def reserved_bytes(self) -> int:
        """Bytes admitted for productions in flight."""
        with self._lock:
            return sum(e.reserved for e in self._entries.values() if e.reserved is not None)

    def reservations(self) -> dict[Any, int]:
        with self._lock:
            return {k: e.reserved for k, e in self._entries.items() if e.reserved is not None}

    # ---- shared source reads ----
    def attach_read(self, name: str) -> tuple[ReadEntry, bool]:
        """Attach one production to the current read of ``name``: (entry, caller_must_schedule_read)."""
        with self._lock:
            entry = self._reads.get(name)
            new = entry is None
            if new:
                entry = self._reads[name] = ReadEntry(name)
            entry.users += 1
            return entry, new

    def current_read(self, name: str) -> ReadEntry | None:
        """The shared read of ``name`` productions are attached to now, or None (none in flight or buffered)."""
        with self._lock:
            return self._reads.get(name)

    def fill_read(self, entry: ReadEntry, value: Any, allocation: Allocation | None) -> None:
        """The read of ``entry`` completed with ``value`` (its PreparationArena bytes in ``allocation``)."""
        with self._lock:
            entry.value = value
            entry.allocation = allocation

    def detach_reads(self, entries: list[ReadEntry]) -> None:
        """A production is finished with its reads (success, failure or cancel); free dead buffers."""
        with self._lock:
            for e in entries:
                e.users -= 1
                if e.users <= 0:
                    if self._reads.get(e.name) is e:
                        del self._reads[e.name]
                    if e.allocation is not None:
                        e.allocation.release()
                    e.value = e.allocation = None

    def _check_gen(self, e: PreparedEntry, generation: int) -> None:
        if e.generation != generation:
            raise InternalError(f"prepared object {e.key}: generation {generation} is stale (now {e.generation})")

    # ---- consumption ----
    def get(self, key: Any) -> Any:
        e = self._entries[key]
        if e.state is not EntryState.RESIDENT:
            raise InternalError(f"prepared object {key} read while {e.state.value}")
        return e.value

    def try_pin(self, key: Any, position: int = 0) -> Any:
        """Pin ``key`` if it is resident and return it; None if it is not (a normal race: it was
        evicted, or is still being produced). The caller releases a pin with :meth:`unpin`."""
        with self._lock:
            e = self._entries[key]
            if e.state is not EntryState.RESIDENT:
                return None
            e.pins += 1
            e.last_use = max(e.last_use, position)
            return e.value

    def pin(self, key: Any, position: int = 0) -> Any:
        """Pin a resident object against eviction and return it; InternalError if it is not resident
        (a caller that cannot know, a consumer racing eviction, uses :meth:`try_pin`)."""
        with self._lock:
            e = self._entries[key]
            if e.state is not EntryState.RESIDENT:
                raise InternalError(f"pin of prepared object {key} while {e.state.value}")
            e.pins += 1
            e.last_use = max(e.last_use, position)
            return e.value

    def acquire_lease(self, epoch: int) -> bool:
        """One run-level pin of every resident object, if ``epoch`` is still the hot epoch.

        This is the hot path's only store operation besides :meth:`release_lease`.
        """
        with self._lock:
            if epoch != self.epoch or self.hot_epoch != epoch:
                return False
            self.leases += 1
            return True

    def release_lease(self) -> None:
        with self._lock:
            if self.leases <= 0:
                raise InternalError("release of a run-level lease that was never acquired")
            self.leases -= 1

    def unpin(self, key: Any) -> None:
        with self._lock:
            e = self._entries[key]
            if e.pins <= 0:
                raise InternalError(f"unpin of unpinned prepared object {key}")
            e.pins -= 1

    def evict(self, key: Any) -> Allocation | None:
        """Drop residency of an unpinned object and return its bytes to the PreparedArena (the store owns
        the published allocation); returns that allocation, released.

        Returns None (and changes nothing) when the object is pinned, leased or not resident.
        """
        with self._lock:
            e = self._entries[key]
            if e.state is not EntryState.RESIDENT or e.pins or self.leases:
                return None
            self._transition(e, EntryState.EVICTING)
            alloc, e.allocation, e.value = e.allocation, None, None
            self._transition(e, EntryState.ABSENT)
            self.counters["evicted"] += 1
        if alloc is not None:
            alloc.release()  # outside the lock: the arena has its own
        return alloc

    def state(self, key: Any) -> EntryState:
        return self._entries[key].state

    def states(self) -> dict[Any, EntryState]:
        with self._lock:
            return {k: e.state for k, e in self._entries.items()}

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values() if e.state is EntryState.RESIDENT)
