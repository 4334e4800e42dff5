"""RuntimeSession: prepare_async / run_async over one scope-aware plan and the runtime scheduler.

A session resolves the model metadata-only, builds one :class:`PreparedExecutionPlan` and owns the
mutable :class:`PreparedExecutionState`. Both entry points return the scheduler's
:class:`ExecutionHandle`:

* ``prepare_async()`` submits every session task (read -> prepack -> publish) eagerly;
* ``run_async(feeds)`` never blocks and never waits for preparation. On the **cold path** inference is
  one continuation over the action list: before an action it checks the readiness of the prepared
  objects that action reads; a missing one has its producer chain ensured and promoted to critical,
  and the continuation yields (``resume_after``) until it is published. On the **hot path** (every
  prepared object resident, readiness epoch unchanged) the run takes one run-level lease and replays
  the action list directly: no per-node task, event lookup or queue operation.

``prepare()`` is ``prepare_async().wait()`` and ``run(feeds)`` is ``run_async(feeds).result()``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any

from onnx_prepared.errors import InvalidFeedError
from onnx_prepared.memory import Arenas
from onnx_prepared.model import ExternalDataReader, LoadedModel, load_model
from onnx_prepared.model.loader import inline_nested_external
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan, build_prepared_plan
from onnx_prepared.prepared import EntryState
from onnx_prepared.resolve import ManifestReader, PreparedKey, ResolvedModel, resolve_model
from onnx_prepared.runtime.feeds import check_value, sparse_to_dense
from onnx_prepared.runtime.state import ExecutionSubmission, PreparedExecutionState, ReadEntry
from onnx_prepared.scheduler import (
    CpuExecutor,
    Domain,
    ExecutionHandle,
    MemoryBudget,
    MemoryEstimate,
    Priority,
    Resource,
    RuntimeScheduler,
    Task,
    TaskState,
)

_FAILED = (TaskState.FAILED, TaskState.SUPPRESSED)

_DEFAULT: RuntimeScheduler | None = None
_DEFAULT_LOCK = threading.Lock()


def default_scheduler() -> RuntimeScheduler:
    """The process-wide scheduler shared by sessions that bring none (like onnxruntime's global pools).

    Its CPU executor has one slot reserved for inference and one for preparation on a 2-core machine.
    Created on first use; closed at interpreter exit.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            import atexit

            workers = min(2, os.cpu_count() or 1)
            _DEFAULT = RuntimeScheduler(cpu=CpuExecutor(workers, critical_reserved=1 if workers > 1 else 0),
                                        io_workers=4, name="onnx-prepared")
            atexit.register(_DEFAULT.close, cancel=True)
        return _DEFAULT


class RuntimeSession:
    """A prepared-execution session over one model.

    >>> sess = RuntimeSession("tiny-llm.onnx")
    >>> h = sess.run_async({"x": x})     # returns at once; runs while weights still load
    >>> (y,) = h.result()
    """

    def __init__(
        self,
        model: str | os.PathLike | LoadedModel,
        options: Any = None,
        *,
        scheduler: RuntimeScheduler | None = None,
        reader: ExternalDataReader | None = None,
    ) -> None:
        self.options = options
        opt = _opt(options)
        loaded = model if isinstance(model, LoadedModel) else load_model(model)
        if loaded.nested_external:
            # NOTE: external tensors inside subgraphs/attributes are read now (onnx.reference-style
            # evaluators read those protos directly); top-level initializers stay metadata-only.
            with ExternalDataReader() as r:
                inline_nested_external(loaded, r)
        policy = opt("prepared_model_policy", "disabled")
        policy = str(getattr(policy, "value", policy))
        self.prepared_store = None
        if policy != "disabled":
            from onnx_prepared.prepared.cache import (
                PreparedModelStore,
                default_prepared_path,
                source_model_digest,
            )

            self.prepared_store = PreparedModelStore(
                opt("prepared_model_path", None) or default_prepared_path(loaded.path),
                source_digest=source_model_digest(loaded.path), policy=policy,
            )
        self.resolved: ResolvedModel = resolve_model(loaded, prepared=self.prepared_store, policy=policy)
        self.plan: PreparedExecutionPlan = build_prepared_plan(self.resolved)
        self.arenas = Arenas.create(prepared_limit=opt("prepared_memory_limit", None))
        self.state = PreparedExecutionState(self.plan, self.arenas, ManifestReader(self.resolved.manifest, reader),
                                            self.prepared_store)
        self.store = self.state.store
        # A session gets its own scheduler only when asked for non-default resources or a trace;
        # otherwise it shares the process-wide one (thread start-up is not free, and N sessions must
        # not mean N thread pools).
        custom = any(opt(k, d) != d for k, d in (("intra_op_num_threads", 0), ("io_workers", 4),
                                                  ("memory_limit", None), ("trace", False)))
        self._owns_scheduler = scheduler is None and custom
        if scheduler is None:
            if custom:
                workers = opt("intra_op_num_threads", 0) or min(2, os.cpu_count() or 1)
                scheduler = RuntimeScheduler(
                    cpu=CpuExecutor(workers, critical_reserved=1 if workers > 1 else 0),
                    io_workers=opt("io_workers", 4),
                    memory=MemoryBudget(opt("memory_limit", None)),
                    trace=bool(opt("trace", False)),
                )
            else:
                scheduler = default_scheduler()
        self.scheduler = scheduler
        self._lock = threading.Lock()
        self._producers: dict[PreparedKey, Task] = {}  # current generation's publishing task
        self._hot: tuple[int, list] | None = None  # (epoch, value template with every object resident)
        self.counters: Counter[str] = Counter()  # "hot_runs", "cold_runs", "yields", "dispatches"
        ex = self.plan.execution
        g = loaded.graph
        self._slot_of = {n: i for i, n in enumerate(ex.slot_names)}
        self._required_inputs = [ex.slot_names[s] for s in ex.input_slots]
        self._input_types = {i.name: i.type for i in g.input}
        self._bit_of_slot = {s: b for b, s in enumerate(self.plan.requirement_slots) if s >= 0}
        # Values that are part of the plan itself, not weights: sparse initializers (inline, tiny).
        self._constants = ex.new_values()
        for sp in g.sparse_initializer:
            if sp.values.name in self._slot_of:
                self._constants[self._slot_of[sp.values.name]] = sparse_to_dense(sp)
        self._internal: set[ExecutionHandle] = set()  # session-owned background submissions
        self._persist_lock = threading.Lock()
        self._persists_pending = 0
        self._persist_tasks: list[Task] = []
        self._closed = False

    # ---- public API ----
    def prepare_async(self) -> ExecutionHandle:
        """Submit every session task not already resident (read -> prepack -> publish), eagerly."""
        order = sorted(range(len(self.plan.requirements)), key=lambda i: self.plan.first_need[i])
        tasks = [t for i in order if (t := self._ensure(self.plan.requirements[i].key, Priority.PREFETCH))]
        # fail_fast=False: one bad object fails only its consumers, not the rest of preparation.
        return self.scheduler.submit(tasks, fail_fast=False)

    def prepare(self, *, sequential: bool = False) -> None:
        """Prepare every object before returning (``prepare_async().wait()``).

        ``sequential=True`` is the spec's reference path: exactly the same session tasks, run one at a
        time in plan order on the calling thread (benchmarks compare it with the parallel schedule).
        """
        if not sequential:
            self.prepare_async().wait()
            self.flush_cache()
            return
        st = self.state
        order = sorted(range(len(self.plan.requirements)), key=lambda i: self.plan.first_need[i])
        work = []
        for i in order:  # claim and attach first, so a source shared by two layouts is read once
            r = self.plan.requirements[i]
            gen, produce = self.store.claim(r.key)
            if produce:
                work.append((r, gen, [st.attach_read(s)[0] for s in r.sources] if r.spec is not None else []))
        for r, gen, entries in work:
            try:
                if r.spec is None:
                    st.read_source(r.sources[0], r.key, gen, None)
                    continue
                for s, entry in zip(r.sources, entries):
                    if entry.value is None:
                        st.read_source(s, None, None, entry)
                st.prepack(r.key, gen, entries)
            except BaseException as e:
                self.store.fail(r.key, gen, e)
                for rr, gg, _ in work:
                    self.store.abandon(rr.key, gg)
                raise
            finally:
                st.detach_reads(entries)

    def run_async(self, feeds: Mapping[str, Any], context: Any = None) -> ExecutionHandle:
        """Submit one inference; returns at once. ``handle.result()`` is the list of outputs.

        ``context`` carries caller-owned mutable bindings (e.g. a KV cache); it belongs to this
        submission only and is kept alive until it is terminal.
        """
        values, overridden = self._bind_feeds(feeds)
        sub = ExecutionSubmission(self.state.next_invocation_id(), values, context)
        sub.held.update(overridden)
        epoch = self.store.epoch
        if self.store.hot_epoch == epoch and self.store.acquire_lease(epoch):
            sub.hot = True
            for s, v in enumerate(self._hot_template()):
                if v is not None and values[s] is None:
                    values[s] = v
            self.counters["hot_runs"] += 1
            task = Task(lambda t: self._run_hot(t, sub), resource=Resource.CPU, priority=Priority.CRITICAL,
                        name=f"I.run-{sub.invocation_id}")
            return self.scheduler.submit(task, result=lambda: self._outputs(sub), keepalive=sub)
        self.counters["cold_runs"] += 1
        task = Task(lambda t: self._run_cold(t, sub), resource=Resource.CPU, priority=Priority.CRITICAL,
                    name=f"I.run-{sub.invocation_id}")
        self.scheduler.when_done(task, lambda t: self._release_pins(sub))
        # Start every producer this run needs now, so reads and prepacks overlap the first nodes.
        # The run binds to the generation current now (spec: RunAsync step 4).
        for b, r in enumerate(self.plan.requirements):
            if b in sub.held:
                continue
            p = self._ensure(r.key, Priority.PREFETCH)
            if p is not None:
                sub.bound[b] = p
        producers = list(dict.fromkeys(sub.bound.values()))
        handle = self.scheduler.submit([task], result=lambda: self._outputs(sub), keepalive=sub)
        if producers:
            # Not added to the run's submission: a run waits only at the consuming node (resume_after),
            # and cancelling it must not cancel preparation another consumer may still want.
            self._keep(self.scheduler.submit(producers, fail_fast=False))
        return handle

    def run(self, feeds: Mapping[str, Any], context: Any = None) -> list:
        """``run_async(feeds, context).result()``."""
        return self.run_async(feeds, context).result()

    def _keep(self, handle: ExecutionHandle) -> None:
        """Own a session-internal handle until it is terminal (dropping a live handle would wait)."""
        with self._lock:
            self._internal.add(handle)
        handle.add_done_callback(self._forget)

    def _forget(self, handle: ExecutionHandle) -> None:
        with self._lock:
            self._internal.discard(handle)

    def close(self) -> None:
        if self._closed:
            return
        if self._persisting:
            # NOTE: a cache that cannot be written is a miss next time, not an error
            with contextlib.suppress(Exception):
                self.flush_cache()
        self._closed = True
        if self._owns_scheduler:
            self.scheduler.close(cancel=True)
        self.state.reader.close()

    def __enter__(self) -> RuntimeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- session tasks ----
    def _ensure(self, key: PreparedKey, priority: Priority) -> Task | None:
        """The task publishing ``key``'s current generation (new if absent/failed); None if resident."""
        with self._lock:
            if self.store.state(key) is EntryState.RESIDENT:
                return None
            t = self._producers.get(key)
            if t is not None and not t.done:
                return t
            gen, produce = self.store.claim(key)
            if not produce:  # resident or published between the checks
                return None if self.store.state(key) is EntryState.RESIDENT else self._producers.get(key)
            t, persist = self._make_producer(key, gen, priority)
            self._producers[key] = t
        self.scheduler.when_done(t, lambda task: self._producer_done(task, key, gen))
        if persist is not None:
            self._keep(self.scheduler.submit(persist, fail_fast=False))
        return t

    def _make_producer(self, key: PreparedKey, gen: int, priority: Priority) -> tuple[Task, Task | None]:
        """The task chain publishing ``key`` (its last task) and, on a cache miss, its background persist."""
        req = self.resolved.requirement(key)
        st = self.state
        manifest = self.resolved.manifest.active
        if req.cached:  # companion hit: read packed bytes -> publish (no source read, no prepack)
            return Task(
                lambda t: st.read_packed(key, gen), resource=Resource.IO, priority=priority,
                memory=MemoryEstimate(Domain.PREPARED, output=req.active.entry.length), name=f"S.{key}.read_packed",
            ), None
        if req.spec is None:  # raw: read -> publish
            name = req.sources[0]
            d = manifest[name].descriptor
            return Task(
                lambda t: st.read_source(name, key, gen, None),
                resource=Resource.IO if d.is_external else Resource.INLINE, priority=priority,
                memory=MemoryEstimate(Domain.PREPARED, output=d.nbytes), name=f"S.{name}.read_source",
            ), None
        entries: list[ReadEntry] = []
        for s in req.sources:
            entry, new = st.attach_read(s)
            if new or entry.task is None or entry.task.state in _FAILED or entry.task.state is TaskState.CANCELLED:
                d = manifest[s].descriptor
                entry.task = Task(
                    lambda t, s=s, e=entry: st.read_source(s, None, None, e),
                    resource=Resource.IO if d.is_external else Resource.INLINE, priority=priority,
                    memory=MemoryEstimate(Domain.PREPARATION, output=d.nbytes), name=f"S.{s}.read_source",
                )
            entries.append(entry)
        t = Task(
            lambda t: st.prepack(key, gen, entries), deps=[e.task for e in entries], resource=Resource.CPU,
            priority=priority, name=f"S.{key}.prepack",
            memory=MemoryEstimate(Domain.PREPARED, input=req.source_bytes, output=req.estimated_bytes),
        )
        self.scheduler.when_done(t, lambda task: st.detach_reads(entries))
        persist = None
        if self._persisting and req.spec.to_bytes is not None:
            persist = Task(lambda t: st.persist(key), deps=[t], resource=Resource.IO, priority=Priority.BACKGROUND,
                           memory=MemoryEstimate(Domain.PREPARATION, temp=req.estimated_bytes),
                           name=f"S.{key}.persist")
            with self._persist_lock:
                self._persists_pending += 1
                self._persist_tasks.append(persist)
            self.scheduler.when_done(persist, self._persist_done)
        return t, persist

    # ---- companion cache persistence ----
    @property
    def _persisting(self) -> bool:
        store = self.prepared_store
        return store is not None and store.policy == "build_if_missing"

    def _persist_done(self, task: Task) -> None:
        with self._persist_lock:
            self._persists_pending -= 1
            self._persist_tasks.remove(task)
            idle = self._persists_pending == 0
        if idle and not self._closed:
            # One generation per burst of persists: flush once nothing else is queued behind it.
            flush = Task(lambda t: self.prepared_store.flush(), resource=Resource.IO, priority=Priority.BACKGROUND,
                         name="S.cache.flush")
            self._keep(self.scheduler.submit(flush, fail_fast=False))

    def flush_cache(self) -> int:
        """Wait for scheduled persists and write the queued entries now; returns entries written."""
        if self.prepared_store is None:
            return 0
        with self._persist_lock:
            pending = list(self._persist_tasks)
        if pending:
            with contextlib.suppress(Exception):  # a failed persist is a miss next time, never a user error
                self.scheduler.submit(pending, fail_fast=False).wait()
        return self.prepared_store.flush()

    def _producer_done(self, task: Task, key: PreparedKey, gen: int) -> None:
        if task.state is TaskState.SUCCEEDED:
            return
        if task.state in _FAILED:
            self.store.fail(key, gen, _producer_error(task))
        else:
            self.store.abandon(key, gen)

    # ---- invocation ----
    def _bind_feeds(self, feeds: Mapping[str, Any]) -> tuple[list, frozenset[int]]:
        """A fresh value list with the checked feeds, and the requirement bits the caller overrode."""
        values = list(self._constants)
        types = self._input_types
        for name in self._required_inputs:
            if name not in feeds:
                raise InvalidFeedError(f"missing input {name!r}; expected inputs: {self._required_inputs}")
        overridden = []
        for name, v in feeds.items():
            tp = types.get(name)
            if tp is None:
                raise InvalidFeedError(f"unknown input {name!r}; expected inputs: {self._required_inputs}")
            slot = self._slot_of[name]
            values[slot] = check_value(name, tp, v)
            b = self._bit_of_slot.get(slot)
            if b is not None:  # an initializer-backed input the caller overrides
                overridden.append(b)
        return values, frozenset(overridden)

    def _run_hot(self, task: Task, sub: ExecutionSubmission) -> None:
        """The hot path: one lease (taken at submission), direct replay, release."""
        try:
            self.plan.execution.replay(sub.values)
        finally:
            self.store.release_lease()

    def _hot_template(self) -> list:
        hot = self._hot
        if hot is None or hot[0] != self.store.epoch:
            template = [None] * self.plan.execution.n_slots
            for r, slot in zip(self.plan.requirements, self.plan.requirement_slots):
                if slot >= 0:
                    template[slot] = self.store.get(r.key)
            hot = self._hot = (self.store.epoch, template)
        return hot[1]

    def _run_cold(self, task: Task, sub: ExecutionSubmission):
        """The cold path: one continuation over the action list, yielding at missing objects."""
        plan = self.plan
        actions = plan.execution.actions
        needs = plan.action_requirements
        reqs = plan.requirements
        slots = plan.requirement_slots
        values = sub.values
        store = self.store
        token = task.token
        while sub.pc < len(actions):
            pc = sub.pc
            for b in needs[pc]:
                if b in sub.held:
                    continue
                key = reqs[b].key
                if store.state(key) is EntryState.RESIDENT:
                    try:
                        values[slots[b]] = store.pin(key, pc)
                    except Exception:  # evicted between the check and the pin: retry below
                        pass
                    else:
                        sub.held.add(b)
                        sub.pinned.append(key)
                        continue
                producer = sub.bound.pop(b, None)
                if producer is not None and producer.state in _FAILED:
                    raise _producer_error(producer)  # the generation this run bound to failed
                if producer is None or producer.done:  # evicted since, or never bound: a new generation
                    producer = self._ensure(key, Priority.CRITICAL)
                    if producer is None:  # published meanwhile
                        return self._run_cold(task, sub)
                self.scheduler.promote(producer, Priority.CRITICAL)
                sub.yields += 1
                self.counters["yields"] += 1
                return task.resume_after(producer)
            token.check()
            _replay_one(plan.execution, values, pc)
            sub.pc = pc + 1
        return None

    def _release_pins(self, sub: ExecutionSubmission) -> None:
        for key in sub.pinned:
            self.store.unpin(key)
        sub.pinned.clear()

    def _outputs(self, sub: ExecutionSubmission) -> list:
        vals = sub.values
        outs = [vals[s] for s in self.plan.execution.output_slots]
        nbytes = sum(int(getattr(o, "nbytes", 0)) for o in outs)
        if nbytes:
            alloc = self.arenas.io.acquire(nbytes, f"outputs of run {sub.invocation_id}", force=True)
            owner = next((o for o in outs if hasattr(o, "nbytes")), None)
            try:
                weakref.finalize(owner, alloc.release)
            except TypeError:
                alloc.release()
        sub.values = []
        return outs


def _producer_error(task: Task) -> BaseException:
    """The error behind a FAILED (or SUPPRESSED by a failure) producer task."""
    t = task if task.state is TaskState.FAILED else (task.cause or task)
    return t.error if t.error is not None else RuntimeError(f"task {task.name} {task.state.name.lower()}")


def _replay_one(ex, values: list, pc: int) -> None:
    # TODO: use ExecutionPlan.replay(start, stop) once the plan exposes a range replay.
    act = ex.actions[pc]
    args = [values[i] for i in act.inputs]
    try:
        res = act.kernel.call(*args)
        for slot, v in zip(act.outputs, res):
            values[slot] = v
    except Exception as e:
        raise ex.kernel_error(act, args, e) from e
    for slot in act.release:
        values[slot] = None


def _opt(options: Any):
    def get(name: str, default: Any) -> Any:
        if options is None:
            return default
        if isinstance(options, Mapping):
            return options.get(name, default)
        return getattr(options, name, default)

    return get
