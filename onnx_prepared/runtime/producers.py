"""Session tasks: the producer chain of each prepared object's current generation, from the plan.

For a key that is not resident, :meth:`Producers.ensure` returns the task that publishes its current
generation, creating the chain when there is none by instantiating the plan's descriptors of that
generation (``plan.generation_tasks``): ``read_packed`` on a companion hit (or the restore of an object
this session persisted and evicted), else ``read_source -> prepack`` / ``publish_raw`` (reads shared
between layouts of one source), plus a background ``persist`` under ``build_if_missing``. Every task's
name is its descriptor's id and its body comes from :data:`~onnx_prepared.runtime.state.BODIES`.
Residency admission happens before a chain is created; a refused prefetch returns :data:`REFUSED`.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

from onnx_prepared.errors import Cancelled
from onnx_prepared.options import EvictionPolicy
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan, TaskDescriptor, TaskKind
from onnx_prepared.prepared import EntryState, ReadEntry
from onnx_prepared.prepared.residency import ResidencyPolicy
from onnx_prepared.resolve import PreparedKey
from onnx_prepared.runtime.residency_budget import ResidencyBudget
from onnx_prepared.runtime.state import BODIES, PreparedExecutionState, SessionTaskInstances
from onnx_prepared.scheduler import Domain, ExecutionHandle, MemoryEstimate, Priority, Resource, Task, TaskState

FAILED_STATES = (TaskState.FAILED, TaskState.SUPPRESSED)
_RESOURCE = {"io": Resource.IO, "cpu": Resource.CPU, "inline": Resource.INLINE}
#: the arena each kind's memory estimate is admitted against (estimated bytes come from the descriptor)
_DOMAIN = {TaskKind.READ_SOURCE: Domain.PREPARATION, TaskKind.PREPACK: Domain.PREPARED,
           TaskKind.PUBLISH_RAW: Domain.PREPARED, TaskKind.READ_PACKED: Domain.PREPARED}


def _estimate(d: TaskDescriptor) -> MemoryEstimate:
    if d.kind is TaskKind.PERSIST:
        return MemoryEstimate(Domain.PREPARATION, temp=d.estimated_input_bytes)
    return MemoryEstimate(_DOMAIN[d.kind], input=d.estimated_input_bytes, output=d.estimated_output_bytes)
REFUSED = object()  #: returned by ensure() when residency refused a prefetch


def weakly(method: Callable) -> Callable:
    """``method`` (bound) called through a weak reference to its object (None once that is gone): a
    callback held by something its object holds, without a reference cycle, so a dropped session is
    freed by reference counting instead of waiting for (and costing) a cyclic collection."""
    ref, func = weakref.ref(method.__self__), method.__func__  # (weakref.WeakMethod costs 3x more, made and called)

    def call(*args: Any) -> Any:
        obj = ref()
        return None if obj is None else func(obj, *args)

    return call


def producer_error(task: Task) -> BaseException:
    """The error behind a FAILED (or SUPPRESSED by a failure) producer task."""
    t = task if task.state is TaskState.FAILED else (task.cause or task)
    return t.error if t.error is not None else RuntimeError(f"task {task.name} {task.state.name.lower()}")


class Producers:
    """Creates and tracks session tasks for one session. Thread-safe (one lock)."""

    def __init__(self, plan: PreparedExecutionPlan, state: PreparedExecutionState, scheduler: Any,
                 limit: int | None, eviction_policy: EvictionPolicy | str) -> None:
        self.plan = plan
        self.state = state
        self.store = state.store
        self.scheduler = scheduler
        self.companion = state.companion
        self._lock = threading.RLock()  # when_done may call back on this thread
        self._internal: set[ExecutionHandle] = set()  # session-owned submissions not yet terminal
        self._persist_tasks: list[Task] = []
        self._queued: dict[PreparedKey, PreparedKey] = {}  # put() by a background persist, key -> digest key
        self.closed = False
        self.on_evict: Callable[[PreparedKey], None] | None = None
        keys = [r.key for r in plan.requirements]
        # Every session task of a key's generation ranks by when inference first needs the key (S2):
        # among ready prepacks a free preparation slot takes the one needed next (medium, cold: layer 0's
        # MLP prepack queued behind layers 1-3's, whose smaller reads had finished first).
        self._rank = {keys[b]: i for i, b in enumerate(plan.need_order)}
        # the budget's callbacks hold this object weakly (weakly): no cycle through them
        policy = ResidencyPolicy(
            limit, {k: i for i, k in enumerate(keys)}, plan.next_need, weakly(self.persisted),
            EvictionPolicy(eviction_policy),
            critical_reserve=max((r.estimated_bytes for r in plan.requirements), default=0),
        )
        self.residency = ResidencyBudget(policy, self.store, state.arenas.prepared,
                                         persist=weakly(self.persist_now) if self.persisting else None,
                                         on_evict=weakly(self._evicted))

    def keep(self, handle: ExecutionHandle) -> None:
        """Own a session-internal handle until it is terminal (dropping a live handle would wait)."""
        with self._lock:
            self._internal.add(handle)
            closed = self.closed
        if closed:  # submitted while close() ran: withdrawn at once
            handle.cancel()
        handle.add_done_callback(self._forget)

    def _forget(self, handle: ExecutionHandle) -> None:
        with self._lock:
            self._internal.discard(handle)

    def close(self) -> None:
        """Cancel this session's own submissions and wait for them to end. On a shared scheduler they
        would otherwise outlive the session: a row table's background read queued by a first run's end
        ran after ``close()``, on the closed session's reader. Tasks already running finish (cancellation
        is cooperative); nothing starts after this returns."""
        with self._lock:
            self.closed = True
            live = list(self._internal)
        for h in live:
            h.cancel()
        for h in live:
            with contextlib.suppress(Exception, Cancelled):  # their failures belong to the runs that wanted them
                h.wait()

    def start(self, chains: list[Task]) -> None:
        """Submit chains created with ``ensure(defer=...)`` together, in one session-owned submission."""
        if chains:
            self.keep(self.scheduler.submit(chains, fail_fast=False))

    @property
    def persisting(self) -> bool:
        ps = self.companion
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
        """Instantiate the plan's descriptors of one generation of ``key`` as scheduler tasks.

        A companion hit runs its read_packed; an object this session persisted and a budget evicted
        its restore (a read_packed of that entry); otherwise its source reads (joined when another
        layout of the same source is reading it) and its prepack or raw publish, plus the background
        persist under build_if_missing. Returns (the publishing task, the persist task or None).
        """
        st = self.state
        restore = self.store.persisted(key) is not None and not self.plan.resolved.requirement(key).cached
        inst = SessionTaskInstances(key, gen)
        made: dict[str, Task] = {}
        for d in self.plan.generation_tasks(key, restore=restore):
            if d.kind is TaskKind.READ_SOURCE:
                entry = self._attach(d, priority, self._rank.get(key))
                inst.reads[d.sources[0]] = entry
                made[d.id] = entry.task
            else:
                made[d.id] = self._task(d, inst, priority, deps=[made[x] for x in d.dependencies],
                                        rank=self._rank.get(key))
        t = made[self.plan.restorer[key] if restore else self.plan.producer[key]]
        if inst.reads:
            entries = list(inst.reads.values())
            self.scheduler.when_done(t, lambda task: st.detach_reads(entries))
        pid = self.plan.persister.get(key)
        persist = None
        if pid is not None and self.persisting and self.store.persisted(key) is None:
            persist = self._task(self.plan.by_id[pid], inst, Priority.BACKGROUND, deps=[t])
            self._persist_tasks.append(persist)  # under self._lock (ensure holds it)
            self.scheduler.when_done(persist, self._persist_done)
        return t, persist

    def _task(self, d: TaskDescriptor, inst: SessionTaskInstances, priority: Priority, deps: list[Task],
              rank: int | None = None) -> Task:
        """One scheduler task for descriptor ``d``: its body from :data:`BODIES`, resource and memory
        from the descriptor."""
        st = self.state
        body = BODIES[d.kind]
        if d.kind is TaskKind.PERSIST:
            def run(t: Task) -> None:
                self._queue(inst.key, body(st, d, inst))
        else:
            def run(t: Task) -> None:
                body(st, d, inst)
        return Task(run, deps=deps, resource=_RESOURCE[d.resource], priority=priority, memory=_estimate(d),
                    name=d.id, rank=rank)

    def _attach(self, d: TaskDescriptor, priority: Priority, rank: int | None) -> ReadEntry:
        """Join the current read of a source, or start one: a source shared by a raw object and a prepack
        (a tied embedding and LM head) is read once."""
        st = self.state
        name = d.sources[0]
        e, new = st.attach_read(name)
        if new or e.task is None or e.task.state in FAILED_STATES or e.task.state is TaskState.CANCELLED:
            e.task = Task(lambda t, e=e: st.read_source(name, e), resource=_RESOURCE[d.resource],
                          priority=priority, memory=_estimate(d), name=d.id, rank=rank)
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
        return key.is_raw or self.store.persisted(key) is not None or self.plan.resolved.requirement(key).cached

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
        if self.companion is None:
            return 0
        with self._lock:
            pending = list(self._persist_tasks)
        if pending:
            with contextlib.suppress(Exception):  # a failed persist is a miss next time, never a user error
                self.scheduler.submit(pending, fail_fast=False).wait()
        return self._flush_store()

    def _flush_store(self) -> int:
        """Flush the companion and make every object it now holds restorable by a packed read."""
        n = self.companion.flush()
        with self._lock:
            queued, self._queued = self._queued, {}
        for key, dkey in queued.items():
            entry = self.companion.lookup(dkey)
            if entry is not None:
                self.state.reader.add_session_entry(key.slot_name, entry)
                self.store.set_persisted(key, entry)
        return n

    def _queue(self, key: PreparedKey, dkey: PreparedKey | None) -> None:
        """A background persist put ``key`` into the companion (as ``dkey``): restorable after a flush."""
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
        entry = self.companion.lookup(dkey)
        if entry is None:
            return False
        self.state.reader.add_session_entry(key.slot_name, entry)
        self.store.set_persisted(key, entry)
        return True

    def _evicted(self, key: PreparedKey) -> None:
        if self.on_evict is not None:
            self.on_evict(key)
