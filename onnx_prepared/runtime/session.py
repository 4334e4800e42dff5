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

import bisect
import contextlib
import os
import threading
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any

from onnx_prepared.errors import ClosedError, InvalidFeedError
from onnx_prepared.kernels import threads
from onnx_prepared.memory import Arenas
from onnx_prepared.model import ExternalDataReader, LoadedModel, load_model
from onnx_prepared.model.loader import inline_nested_external
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan, build_prepared_plan
from onnx_prepared.resolve import ManifestReader, PreparedKey, ResolvedModel, resolve_model
from onnx_prepared.runtime import continuation
from onnx_prepared.runtime.feeds import check_value, sparse_to_dense
from onnx_prepared.runtime.producers import REFUSED, Producers
from onnx_prepared.runtime.state import ExecutionSubmission, PrefetchWindow, PreparedExecutionState
from onnx_prepared.scheduler import (
    CpuExecutor,
    ExecutionHandle,
    MemoryBudget,
    Priority,
    Resource,
    RuntimeScheduler,
    Task,
)

_DEFAULT: RuntimeScheduler | None = None
_DEFAULT_LOCK = threading.Lock()


def default_scheduler() -> RuntimeScheduler:
    """The process-wide scheduler shared by sessions that bring none (like onnxruntime's global pools).

    Its CPU executor has one worker per core (:func:`~onnx_prepared.kernels.threads.machine_threads`), one
    of them reserved for inference: preparation may use the others. Created on first use; closed at
    interpreter exit.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            import atexit

            workers = threads.machine_threads()
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
        from onnx_prepared.options import as_session_options

        self.options = options = as_session_options(options)  # validated: a bad value fails here, named
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

            digest = source_model_digest(loaded.path, loaded.model)
            self.prepared_store = PreparedModelStore(
                opt("prepared_model_path", None) or default_prepared_path(loaded.path, digest=digest,
                                                                          model=loaded.model),
                source_digest=digest, policy=policy,
            )
            self.prepared_store.bind_sources(loaded.weights)  # digests trusted only under these fingerprints
        if reader is None:
            # A tensor larger than memory_limit (or physical memory) is refused naming it, before numpy
            # is asked for the buffer; prepared_memory_limit is a residency target one object may exceed.
            # Recorded checksums are verified when a companion's identity depends on them.
            reader = ExternalDataReader(max_tensor_bytes=opt("memory_limit", None) or None,
                                        verify_checksums=policy != "disabled")
        if self.prepared_store is not None and self.prepared_store.writable:
            reader.hash_reads = True  # every source read yields the (digest, fingerprint) the sidecar persists
        self.resolved: ResolvedModel = resolve_model(loaded, prepared=self.prepared_store, policy=policy)
        self.plan: PreparedExecutionPlan = build_prepared_plan(self.resolved)
        # NOTE: prepared_memory_limit is the residency budget (Producers' admission evicts and refuses
        # against it, and admits critical work above it: the run that needs it is what frees memory),
        # so it is not also a hard PreparedArena limit that a publish could fail on.
        self.arenas = Arenas.create(retention_caps=opt("arena_retention_caps", None))
        self.state = PreparedExecutionState(self.plan, self.arenas, ManifestReader(self.resolved.manifest, reader),
                                            self.prepared_store)
        self.store = self.state.store
        # Threads one kernel call may use (native pool, BLAS); fewer while preparation holds CPU slots.
        self.intra_op_threads = threads.resolve(opt("intra_op_num_threads", 0))
        # A session gets its own scheduler only when asked for non-default resources or a trace;
        # otherwise it shares the process-wide one (thread start-up is not free, and N sessions must
        # not mean N thread pools).
        custom = any(opt(k, d) != d for k, d in (("io_workers", 4), ("memory_limit", None)))
        custom = custom or options.records_trace
        self._owns_scheduler = scheduler is None and custom
        if scheduler is None:
            if custom:
                workers = threads.machine_threads()
                scheduler = RuntimeScheduler(
                    cpu=CpuExecutor(workers, critical_reserved=1 if workers > 1 else 0),
                    io_workers=opt("io_workers", 4),
                    memory=MemoryBudget(opt("memory_limit", None)),
                    trace=options.records_trace,
                )
            else:
                scheduler = default_scheduler()
        self.scheduler = scheduler
        self._lock = threading.Lock()
        self._internal: set[ExecutionHandle] = set()  # session-owned background submissions
        self._closed = False
        self.producers = Producers(self.plan, self.state, scheduler, self._keep,
                                   opt("prepared_memory_limit", None), opt("eviction_policy", "auto"))
        self.producers.on_evict = self._evicted
        self._hot: tuple[int, list] | None = None  # (epoch, value template with every object resident)
        self.counters: Counter[str] = Counter()  # "hot_runs", "cold_runs", "yields"
        # OpenBLAS's thread count, the same for every run (None: kernels.threads.DEFAULT_BLAS_THREADS)
        self.blas_threads = opt("blas_threads", None)
        # look-ahead window (requirements ahead of the run) used under a residency budget
        self.window = PrefetchWindow(8, len(self.plan.requirements))
        firsts = self.plan.first_need
        self.need_order = tuple(sorted(range(len(firsts)), key=lambda b: (firsts[b], b)))
        self._need_firsts = [firsts[b] for b in self.need_order]
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

    # ---- public API ----
    def prepare_async(self) -> ExecutionHandle:
        """Submit every session task not already resident (read -> prepack -> publish), eagerly.

        Under a residency budget only what fits is prepared (the rest is restored on demand).
        """
        self._check_open("prepare")
        tasks = []
        chains: list = []  # every chain is created before any starts, so a source shared by two
        for b in self.need_order:  # layouts is attached to both before its read can finish: read once
            t = self.producers.ensure(self.plan.requirements[b].key, Priority.PREFETCH, defer=chains)
            if t is REFUSED:
                break
            if t is not None:
                tasks.append(t)
        if chains:
            self._keep(self.scheduler.submit(chains, fail_fast=False))
        # fail_fast=False: one bad object fails only its consumers, not the rest of preparation.
        return self.scheduler.submit(tasks, fail_fast=False)

    def prepare(self, *, sequential: bool = False, progress: Any = None) -> None:
        """Prepare every object before returning (``prepare_async().wait()``), and flush the cache.

        ``sequential=True`` is the spec's reference path: exactly the same session tasks, run one at a
        time in plan order on the calling thread (benchmarks compare it with the parallel schedule).
        ``progress`` (default: ``SessionOptions.progress``): True for a tqdm bar on a terminal, or
        ``fn(done, total)`` called with the number of resident prepared objects; None is silent.
        """
        from onnx_prepared.progress import reporter

        report = reporter(self.options.progress if progress is None else progress, len(self.plan.requirements),
                          "prepare")
        if sequential:
            self.state.prepare_sequential([self.plan.requirements[b] for b in self.need_order])
        elif report is None:
            self.prepare_async().wait()
        else:
            self.wait_reporting(self.prepare_async(), report)
        self.producers.flush()
        if report is not None:
            report(len(self.plan.requirements), len(self.plan.requirements))

    def wait_reporting(self, handle: ExecutionHandle, report: Any, interval: float = 0.1) -> None:
        """``handle.wait()``, calling ``report(resident prepared objects, total)`` every ``interval`` s."""
        from onnx_prepared.prepared.store import EntryState

        total = len(self.plan.requirements)
        while True:
            try:
                handle.wait(timeout=interval)  # re-raises a failure
                return
            except TimeoutError:
                report(sum(s is EntryState.RESIDENT for s in self.store.states().values()), total)

    def flush_cache(self) -> int:
        """Write every pending companion-cache entry now; returns how many were written."""
        return self.producers.flush()

    def run_async(self, feeds: Mapping[str, Any], context: Any = None) -> ExecutionHandle:
        """Submit one inference; returns at once. ``handle.result()`` is the list of outputs.

        ``context`` carries caller-owned mutable bindings (e.g. a KV cache); it belongs to this
        submission only and is kept alive until it is terminal.
        """
        return self._submit(feeds, context, inline=False)

    def _submit(self, feeds: Mapping[str, Any], context: Any, *, inline: bool) -> ExecutionHandle:
        """One submission. ``inline`` (used by :meth:`run`, which waits anyway) runs a hot run as an
        inline task on the calling thread: the same task, lease and replay without the hand-off to a
        CPU worker (25-55 us per run measured). A cold run always goes to the CPU workers: it yields.
        """
        self._check_open("run")
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
            task = Task(lambda t: continuation.run_hot(self, t, sub),
                        resource=Resource.INLINE if inline else Resource.CPU,
                        priority=Priority.CRITICAL, name=f"I.run-{sub.invocation_id}")
            return self.scheduler.submit(task, result=lambda: self._outputs(sub), keepalive=sub)
        self.counters["cold_runs"] += 1
        task = Task(lambda t: continuation.run_cold(self, t, sub), resource=Resource.CPU,
                    priority=Priority.CRITICAL, name=f"I.run-{sub.invocation_id}")
        self.scheduler.when_done(task, lambda t: continuation.release_run(self, sub))
        # Start the producers this run needs now, so reads and prepacks overlap the first nodes; the run
        # binds to the generations current now (spec: RunAsync step 4) and waits only at the consuming
        # node. Under a budget only the look-ahead window is started.
        if self.producers.residency.limited:
            continuation.prefetch(self, sub, 0)
        else:
            chains: list = []  # created first, started together: shared source reads stay shared
            for b, r in enumerate(self.plan.requirements):
                if b not in sub.held:
                    p = self.producers.ensure(r.key, Priority.PREFETCH, defer=chains)
                    if p is not None:
                        sub.bound[b] = p
            if chains:
                self._keep(self.scheduler.submit(chains, fail_fast=False))
        return self.scheduler.submit([task], result=lambda: self._outputs(sub), keepalive=sub)

    def run(self, feeds: Mapping[str, Any], context: Any = None) -> list:
        """``run_async(feeds, context).result()`` (a hot run executes on this thread; see ``_submit``)."""
        return self._submit(feeds, context, inline=True).result()

    def _check_open(self, what: str) -> None:
        # One error whatever the scheduler: an own scheduler is closed with the session, the shared
        # default one is not, and a run must not depend on which (ClosedError, not RuntimeError).
        if self._closed:
            raise ClosedError(f"{what}() on a closed RuntimeSession: create a new session")

    def close(self) -> None:
        """Flush the companion cache (when persisting) and release the session's resources."""
        if self._closed:
            return
        if self.producers.persisting:
            # NOTE: a cache that cannot be written is a miss next time, not an error
            with contextlib.suppress(Exception):
                self.producers.flush()
        self._closed = self.producers.closed = True
        if self._owns_scheduler:
            self.scheduler.close(cancel=True)
        self.state.reader.close()
        if self.prepared_store is not None:  # the companion store this session opened (its data fds)
            self.prepared_store.close()

    def __enter__(self) -> RuntimeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----
    def need_index(self, position: int) -> int:
        """Index in ``need_order`` of the first requirement first needed at or after ``position``."""
        return bisect.bisect_left(self._need_firsts, position)

    def _keep(self, handle: ExecutionHandle) -> None:
        """Own a session-internal handle until it is terminal (dropping a live handle would wait)."""
        with self._lock:
            self._internal.add(handle)
        handle.add_done_callback(self._forget)

    def _forget(self, handle: ExecutionHandle) -> None:
        with self._lock:
            self._internal.discard(handle)

    def _evicted(self, key: PreparedKey) -> None:
        self._hot = None  # the template must not keep an evicted object alive

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

    def _hot_template(self) -> list:
        hot = self._hot
        if hot is None or hot[0] != self.store.epoch:
            template = [None] * self.plan.execution.n_slots
            for r, slot in zip(self.plan.requirements, self.plan.requirement_slots):
                if slot >= 0:
                    template[slot] = self.store.get(r.key)
            hot = self._hot = (self.store.epoch, template)
        return hot[1]

    def _outputs(self, sub: ExecutionSubmission) -> list:
        """The run's outputs; their bytes move to the IOArena until the caller drops them."""
        vals = sub.values
        outs = [vals[s] for s in self.plan.execution.output_slots]
        nbytes = sum(int(getattr(o, "nbytes", 0)) for o in outs)
        if nbytes:
            alloc = self.arenas.io.acquire(nbytes, f"outputs of run {sub.invocation_id}")
            owner = next((o for o in outs if hasattr(o, "nbytes")), None)
            try:
                weakref.finalize(owner, alloc.release)
            except TypeError:
                alloc.release()
        sub.values = []
        return outs


def _opt(options: Any):
    def get(name: str, default: Any) -> Any:
        if options is None:
            return default
        if isinstance(options, Mapping):
            return options.get(name, default)
        return getattr(options, name, default)

    return get
