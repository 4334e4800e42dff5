"""ResidencyBudget: acts on the residency policy's decisions for one session.

:class:`~onnx_prepared.prepared.residency.ResidencyPolicy` decides (how many bytes a production must
free, which objects are victims, in which order); this class admits a production by reserving its bytes
in the store's generation record, and frees the shortfall by evicting the policy's victims through the
store (persist-then-evict under ``eviction_policy="auto"`` when the session persists). Decisions and
the reservation happen under one lock, so two admissions never pick the same bytes twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from onnx_prepared.memory import Arena
from onnx_prepared.options import EvictionPolicy
from onnx_prepared.prepared import EntryState, PreparedObjectStore
from onnx_prepared.prepared.residency import ResidencyPolicy
from onnx_prepared.records import field, record


@record
class ResidencyLog:
    """What the budget did, in order (tests assert the spec's offloading sequence from it)."""

    events: list[tuple[str, Any, int]] = field(default_factory=list)  # (event, key, position)

    def add(self, event: str, key: Any, position: int) -> None:
        self.events.append((event, key, position))


class ResidencyBudget:
    """Keeps ``arena.live`` + in-flight reservations within the policy's limit. Thread-safe (one lock)."""

    def __init__(self, policy: ResidencyPolicy, store: PreparedObjectStore, arena: Arena, *,
                 persist: Callable[[Any], bool] | None = None,
                 on_evict: Callable[[Any], None] | None = None) -> None:
        self.policy = policy
        self.store = store
        self.arena = arena
        self._persist = persist  # persist-then-evict (None: the session does not persist)
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self.log = ResidencyLog()
        self.evictions = 0

    @property
    def limited(self) -> bool:
        return self.policy.limited

    @property
    def limit(self) -> int | None:
        return self.policy.limit

    @property
    def inflight(self) -> dict[Any, int]:
        """Bytes admitted per production in flight (recorded in the store's generation records)."""
        return self.store.reservations()

    def headroom(self) -> int | None:
        """Bytes still admissible (None when unlimited)."""
        if self.policy.limit is None:
            return None
        return self.policy.limit - self.arena.live - self.store.reserved_bytes()

    def admit(self, key: Any, nbytes: int, position: int, *, critical: bool) -> bool:
        """Reserve ``nbytes`` for producing ``key``; evicts what it may. False: prefetch refused."""
        if self.policy.limit is None:
            return True
        with self._lock:
            if self.store.is_reserved(key):
                return True
            need = self.policy.shortfall(self.arena.live, self.store.reserved_bytes(), nbytes, critical=critical)
            if need > 0:
                need -= self._evict(need, position, key, critical)
            if need > 0 and not critical:
                return False
            self.store.reserve(key, nbytes)
            return True

    def settle(self, key: Any) -> None:
        """The production of ``key`` ended (published, failed or cancelled): drop its reservation."""
        self.store.settle(key)

    def _evict(self, need: int, position: int, protect: Any, critical: bool) -> int:
        freed = 0
        for key in self.policy.victims(self.store, position, protect, critical=critical):
            if freed >= need:
                break
            if (self.policy.eviction is EvictionPolicy.AUTO and self._persist is not None
                    and not self.policy.persisted(key)):
                self._persist(key)  # persist-then-evict: the restore becomes a cache read
            nbytes = self.store.entry(key).nbytes
            self.store.evict(key)  # returns the bytes to the PreparedArena
            if self.store.state(key) is not EntryState.ABSENT:
                continue  # pinned meanwhile
            freed += nbytes
            self.evictions += 1
            self.log.add("evict", key, position)
            if self._on_evict is not None:
                self._on_evict(key)
        return freed
