"""Session tasks: the producer chain of each prepared object's current generation.

For a key that is not resident, :meth:`Producers.ensure` returns the task that publishes its current
generation, creating the chain when there is none: ``read_packed`` on a companion hit (or for an
object this session persisted and evicted), else ``read_source -> prepack`` (reads shared between
layouts of one source), plus a background ``persist`` under ``build_if_missing``. Residency admission
happens before a chain is created; a refused prefetch returns :data:`REFUSED`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan
from onnx_prepared.prepared import EntryState, ReadEntry
from onnx_prepared.prepared.residency import ResidencyManager
from onnx_prepared.resolve import PreparedKey
from onnx_prepared.runtime.state import PreparedExecutionState
from onnx_prepared.scheduler import Domain, ExecutionHandle, MemoryEstimate, Priority, Resource, Task, TaskState

FAILED_STATES = (TaskState.FAILED, TaskState.SUPPRESSED)
REFUSED = object()  #: returned by ensure() when residency refused a prefetch


def producer_error(task: Task) -> BaseException:
    """The error behind a FAILED (or SUPPRESSED by a failure) producer task."""
    t = task if task.state is TaskState.FAILED else (task.cause or task)
    return t.error if t.error is not None else RuntimeError(f"task {task.name} {task.state.name.lower()}")


class Producers:
    """Creates and tracks session tasks for one session. Thread-safe (one lock)."""

    def __init__(self, plan: PreparedExecutionPlan, state: PreparedExecutionState, scheduler: Any,
                 limit: int | None, eviction_policy: str) -> None:
        self.plan = plan
        self.state = state
        self.store = state.store
        self.scheduler = scheduler
        self.prepared_store = state.prepared_store
        self._lock = threading.RLock()  # when_done may call back on this thread
        self._internal: set[ExecutionHandle] = set()  # session-owned submissions not yet terminal
        self._persist_tasks: list[Task] = []
        self.session_entries: dict[PreparedKey, Any] = {}  # persisted by this session (restore tier)
        self._queued: dict[PreparedKey, PreparedKey] = {}  # put() by a background persist, key -> digest key
        self.closed = False
        self.on_evict: Callable[[PreparedKey], None] | None = None
        keys = [r.key for r in plan.requirements]
        self.residency = ResidencyManager(
            self.store, state.arenas.prepared, limit, keys=keys, next_need=plan.next_need,
            persisted=self.persisted, persist=self.persist_now if self.persisting else None,
            policy=eviction_policy, on_evict=self._evicted,
            critical_reserve=max((r.estimated_bytes for r in plan.requirements), default=0),
        )

    def keep(self, handle: ExecutionHandle) -> None:
        """Own a session-internal handle until it is terminal (dropping a live handle would wait)."""
        with self._lock:
            self._internal.add(handle)
        handle.add_done_callback(self._forget)

    def _forget(self, handle: ExecutionHandle) -> None:
        with self._lock:
            self._internal.discard(handle)

    def start(self, chains: list[Task]) -> None:
        """Submit chains created with ``ensure(defer=...)`` together, in one session-owned submission."""
        if chains:
            self.keep(self.scheduler.submit(chains, fail_fast=False))

    @property
    def persisting(self) -> bool:
        ps = self.prepared_store
        return ps is not None and ps.writable  # policy build_if_missing (and not degraded to read_only)

    # ---- producers ----
    def ensure(self, key: PreparedKey, priority: Priority, position: int = 0, *, defer: list | None = None) -> Any:
        """The task publishing ``key``'s current generation; None if resident; REFUSED (prefetch only).

        A new chain starts at once in a session-owned submission, or, with ``defer``, is appended to it
        for the caller to submit (prepare_async creates every chain first: shared reads stay shared).
        """
        persist = None
        with self._lock:
            if self.store.state(key) is EntryState.RESIDENT:
                return None
            t = self.store.producer(key)
            if t is not None and not t.done:
                return t
            req = self.plan.resolved.requirement(key)
            critical = priority is Priority.CRITICAL
            if not self.residency.admit(key, req.estimated_bytes, position, critical=critical):
                return REFUSED
            gen, produce = self.store.claim(key)
            if not produce:  # published between the checks
                self.residency.settle(key)
                return None if self.store.state(key) is EntryState.RESIDENT else self.store.producer(key)
            t, persist = self._make(key, gen, priority)
            self.store.set_producer(key, gen, t)
        self.scheduler.when_done(t, lambda task: self._done(task, key, gen))
        # Started now, in a session-owned submission: the chain runs while the run that asked for it
        # executes earlier nodes (that is the overlap), and a run's cancel only withdraws its interest.
        new = [t] if persist is None else [t, persist]
        if defer is not None:
            defer.extend(new)
        else:
            self.keep(self.scheduler.submit(new, fail_fast=False))
        return t

    def _make(self, key: PreparedKey, gen: int, priority: Priority) -> tuple[Task, Task | None]:
        req = self.plan.resolved.requirement(key)
        st = self.state
        manifest = self.plan.resolved.manifest.active
        entry = req.active.entry if req.cached else self.session_entries.get(key)
        if entry is not None:  # companion hit: read packed bytes -> publish (no source read, no prepack)
            return Task(
                lambda t: st.read_packed(key, gen), resource=Resource.IO, priority=priority,
                memory=MemoryEstimate(Domain.PREPARED, output=entry.length), name=f"S.{key}.read_packed",
            ), None
        entries = [self._attach(s, priority) for s in req.sources]
        if req.spec is None:  # raw: the (shared) read publishes its bytes as they are
            name = req.sources[0]
            t = Task(lambda t: st.publish_raw(key, gen, entries[0]), deps=[entries[0].task],
                     resource=Resource.INLINE, priority=priority, name=f"S.{name}.publish",
                     memory=MemoryEstimate(Domain.PREPARED, output=manifest[name].descriptor.nbytes))
            self.scheduler.when_done(t, lambda task: st.detach_reads(entries))
            return t, None
        t = Task(
            lambda t: st.prepack(key, gen, entries), deps=[e.task for e in entries], resource=Resource.CPU,
            priority=priority, name=f"S.{key}.prepack",
            memory=MemoryEstimate(Domain.PREPARED, input=req.source_bytes, output=req.estimated_bytes),
        )
        self.scheduler.when_done(t, lambda task: st.detach_reads(entries))
        persist = None
        if self.persisting and req.spec.to_bytes is not None and key not in self.session_entries:
            persist = Task(lambda t: self._persist_bg(key), deps=[t], resource=Resource.IO,
                           priority=Priority.BACKGROUND,
                           memory=MemoryEstimate(Domain.PREPARATION, temp=req.estimated_bytes),
                           name=f"S.{key}.persist")
            self._persist_tasks.append(persist)  # under self._lock (ensure holds it)
            self.scheduler.when_done(persist, self._persist_done)
        return t, persist

    def _attach(self, name: str, priority: Priority) -> ReadEntry:
        """Join the current read of a source, or start one: a source shared by a raw object and a prepack
        (a tied embedding and LM head) is read once."""
        st = self.state
        e, new = st.attach_read(name)
        if new or e.task is None or e.task.state in FAILED_STATES or e.task.state is TaskState.CANCELLED:
            d = self.plan.resolved.manifest.active[name].descriptor
            e.task = Task(
                lambda t, e=e: st.read_source(name, e),
                resource=Resource.IO if d.is_external else Resource.INLINE, priority=priority,
                memory=MemoryEstimate(Domain.PREPARATION, output=d.nbytes), name=f"S.{name}.read_source",
            )
        return e

    def _done(self, task: Task, key: PreparedKey, gen: int) -> None:
        self.residency.settle(key)
        if task.state is TaskState.SUCCEEDED:
            return
        if task.state in FAILED_STATES:
            self.store.fail(key, gen, producer_error(task))
        else:
            self.store.abandon(key, gen)

    # ---- persistence (companion cache) ----
    def persisted(self, key: PreparedKey) -> bool:
        """True when a restore is one read: a companion entry exists, or the object is a raw source."""
        return key.is_raw or key in self.session_entries or self.plan.resolved.requirement(key).cached

    def _persist_done(self, task: Task) -> None:
        with self._lock:
            self._persist_tasks.remove(task)
            idle = not self._persist_tasks
        if idle and not self.closed:
            # One generation per burst of persists: flush once nothing else is queued behind it.
            flush = Task(lambda t: self._flush_store(), resource=Resource.IO, priority=Priority.BACKGROUND,
                         name="S.cache.flush")
            self.keep(self.scheduler.submit(flush, fail_fast=False))

    def flush(self) -> int:
        """Wait for scheduled persists and write the queued entries now; returns entries written."""
        if self.prepared_store is None:
            return 0
        with self._lock:
            pending = list(self._persist_tasks)
        if pending:
            with contextlib.suppress(Exception):  # a failed persist is a miss next time, never a user error
                self.scheduler.submit(pending, fail_fast=False).wait()
        return self._flush_store()

    def _flush_store(self) -> int:
        """Flush the companion and make every object it now holds restorable by a packed read."""
        n = self.prepared_store.flush()
        with self._lock:
            queued, self._queued = self._queued, {}
        for key, dkey in queued.items():
            entry = self.prepared_store.lookup(dkey)
            if entry is not None:
                self.state.reader.add_session_entry(key.slot_name, entry)
                self.session_entries[key] = entry
        return n

    def _persist_bg(self, key: PreparedKey) -> None:
        dkey = self.state.persist(key)
        if dkey is not None:
            with self._lock:
                self._queued[key] = dkey

    def persist_now(self, key: PreparedKey) -> bool:
        """Persist-then-evict: write a resident object to the companion model now; True when it is there."""
        if not self.persisting or self.persisted(key):
            return self.persisted(key)
        spec = self.plan.resolved.requirement(key).spec
        if spec is None or spec.to_bytes is None:
            return False
        with self._lock:
            dkey = self._queued.pop(key, None)  # already queued by its background persist: just flush
        if dkey is None:
            dkey = self.state.persist(key)
        if dkey is None:
            return False
        self._flush_store()
        entry = self.prepared_store.lookup(dkey)
        if entry is None:
            return False
        self.state.reader.add_session_entry(key.slot_name, entry)
        self.session_entries[key] = entry
        return True

    def _evicted(self, key: PreparedKey) -> None:
        if self.on_evict is not None:
            self.on_evict(key)
