"""Residency budget: admit productions into PreparedArena and evict by the plan's order.

The policy is the spec's "Prepared-object residency" paragraph made concrete:

* a production (read -> prepack -> publish, or a cache read) is *admitted* before it is scheduled:
  its estimated bytes are reserved against ``limit`` together with what is already resident;
* when the reservation does not fit, unpinned resident objects are evicted: only objects the plan
  needs again *later* than the one being admitted (evicting something needed sooner would only make
  the run wait for it; a critical admission may take any unpinned object), persisted ones first
  (their restore is one read), then the one needed furthest in the future (the distance wraps into
  the next run, so the embedding used at the start of every token outranks a block already
  consumed);
* an object pinned by a running consumer, or leased by a hot run, is never evicted;
* prefetch keeps ``critical_reserve`` bytes (the largest object) free, so the object the run needs next
  never has to evict what it needs right after; prefetch that does not fit is refused (it retries at
  the next prefetch point); critical work is
  admitted once everything evictable is gone, even above the limit, because the inference that
  needs it is what frees memory.

Not an allocator: the arena stays the ledger of live bytes; this class only decides.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onnx_prepared.memory import Arena
from onnx_prepared.prepared.store import EntryState, PreparedObjectStore


@dataclass
class ResidencyLog:
    """What the policy did, in order (tests assert the spec's offloading sequence from it)."""

    events: list[tuple[str, Any, int]] = field(default_factory=list)  # (event, key, position)

    def add(self, event: str, key: Any, position: int) -> None:
        self.events.append((event, key, position))


class ResidencyManager:
    """Keeps ``arena.live`` + in-flight reservations within ``limit``. Thread-safe (one lock)."""

    def __init__(
        self,
        store: PreparedObjectStore,
        arena: Arena,
        limit: int | None,
        *,
        keys: list[Any],
        next_need: Callable[[int, int], int],
        persisted: Callable[[Any], bool] = lambda key: False,
        persist: Callable[[Any], bool] | None = None,
        policy: str = "auto",
        on_evict: Callable[[Any], None] | None = None,
        critical_reserve: int = 0,
    ) -> None:
        self.critical_reserve = critical_reserve
        self.store = store
        self.arena = arena
        self.limit = limit
        self._bit = {k: i for i, k in enumerate(keys)}
        self._next_need = next_need
        self._persisted = persisted
        self._persist = persist
        self.policy = policy  # "auto": persist-then-evict when possible, else drop; "drop"; "refuse"
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self.log = ResidencyLog()
        self.evictions = 0

    @property
    def limited(self) -> bool:
        return self.limit is not None

    @property
    def inflight(self) -> dict[Any, int]:
        """Bytes admitted per production in flight (recorded in the store's generation records)."""
        return self.store.reservations()

    def headroom(self) -> int | None:
        """Bytes still admissible (None when unlimited)."""
        if self.limit is None:
            return None
        return self.limit - self.arena.live - self.store.reserved_bytes()

    def admit(self, key: Any, nbytes: int, position: int, *, critical: bool) -> bool:
        """Reserve ``nbytes`` for producing ``key``; evicts what it may. False: prefetch refused."""
        if self.limit is None:
            return True
        with self._lock:
            if self.store.is_reserved(key):
                return True
            need = self.arena.live + self.store.reserved_bytes() + nbytes - self.limit
            if not critical:
                need += min(self.critical_reserve, max(0, self.limit - nbytes))
            if need > 0:
                need -= self._evict(need, position, protect=key, critical=critical)
            if need > 0 and not critical:
                return False
            self.store.reserve(key, nbytes)
            return True

    def settle(self, key: Any) -> None:
        """The production of ``key`` ended (published, failed or cancelled): drop its reservation."""
        self.store.settle(key)

    def _candidates(self, position: int, protect: Any, critical: bool) -> list[Any]:
        bound = -1 if critical else self._next_need(self._bit[protect], position)
        cands = []
        for k in self._bit:
            e = self.store.entry(k)
            if k == protect or e.state is not EntryState.RESIDENT or e.pins:
                continue
            dist = self._next_need(self._bit[k], position)
            if dist > bound:
                cands.append((not self._persisted(k), -dist, k))
        cands.sort(key=lambda c: c[:2])  # persisted first, then the furthest next need
        return [c[2] for c in cands]

    def _evict(self, need: int, position: int, protect: Any, critical: bool) -> int:
        freed = 0
        if self.store.leases:
            return 0  # a hot run holds every resident object
        for key in self._candidates(position, protect, critical):
            if freed >= need:
                break
            if not self._persisted(key):
                if self.policy == "refuse":
                    continue
                if self.policy == "auto" and self._persist is not None:
                    self._persist(key)  # persist-then-evict: the restore becomes a cache read
            nbytes = self.store.entry(key).nbytes
            alloc = self.store.evict(key)
            if self.store.state(key) is not EntryState.ABSENT:
                continue  # pinned meanwhile
            if alloc is not None:
                alloc.release()
            freed += nbytes
            self.evictions += 1
            self.log.add("evict", key, position)
            if self._on_evict is not None:
                self._on_evict(key)
        return freed
