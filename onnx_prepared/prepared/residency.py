"""Residency policy: how many bytes a production must free, and which resident objects to evict.

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
  the next prefetch point); critical work is admitted once everything evictable is gone, even above
  the limit, because the inference that needs it is what frees memory.

Pure: :class:`ResidencyPolicy` reads the store's records and decides; it changes nothing. The
session's :class:`~onnx_prepared.runtime.residency_budget.ResidencyBudget` acts on its decisions
(reserves, persists, evicts through the store). Not an allocator: the arena stays the ledger of live
bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnx_prepared.options import EvictionPolicy
from onnx_prepared.prepared.store import EntryState, PreparedObjectStore
from onnx_prepared.records import record


@record(frozen=True, slots=True)
class ResidencyPolicy:
    """Decides admission shortfalls and eviction victims (read-only; thread-safe)."""

    limit: int | None
    bits: dict[Any, int]  # key -> requirement bit (the plan's order)
    next_need: Callable[[int, int], int]  # (bit, position) -> actions until that requirement is read
    persisted: Callable[[Any], bool]  # True when a restore is one read
    eviction: EvictionPolicy = EvictionPolicy.AUTO
    critical_reserve: int = 0

    @property
    def limited(self) -> bool:
        return self.limit is not None

    def shortfall(self, live: int, reserved: int, nbytes: int, *, critical: bool) -> int:
        """Bytes to free before ``nbytes`` more may be reserved (<= 0: it fits)."""
        assert self.limit is not None
        need = live + reserved + nbytes - self.limit
        if not critical:
            need += min(self.critical_reserve, max(0, self.limit - nbytes))
        return need

    def victims(self, store: PreparedObjectStore, position: int, protect: Any, *, critical: bool) -> list[Any]:
        """Evictable keys, in eviction order: unpinned resident objects needed later than ``protect``
        (any, when critical), persisted first, then the furthest next need. Under ``refuse`` only
        persisted objects (whose restore is a read) are candidates."""
        if store.leases:
            return []  # a hot run holds every resident object
        bound = -1 if critical else self.next_need(self.bits[protect], position)
        cands = []
        for k, bit in self.bits.items():
            e = store.entry(k)
            if k == protect or e.state is not EntryState.RESIDENT or e.pins:
                continue
            persisted = self.persisted(k)
            if not persisted and self.eviction is EvictionPolicy.REFUSE:
                continue
            dist = self.next_need(bit, position)
            if dist > bound:
                cands.append((not persisted, -dist, k))
        cands.sort(key=lambda c: c[:2])  # persisted first, then the furthest next need
        return [c[2] for c in cands]
