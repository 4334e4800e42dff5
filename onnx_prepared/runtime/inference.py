"""Inference: one submission's two paths over the plan's action list, hot and cold.

Hot (every prepared object resident, readiness epoch unchanged at submission): the run holds one
run-level lease taken at submission and replays the compact action list directly.

Both paths charge their activations to the session's ExecutionArena. The cold path charges each value
as it is produced and releases it at its last use (measuring the run's peak); the hot path, whose loop
must not pay per action, charges that measured peak once for the whole run, so an ExecutionArena limit
fails a hot run before its first kernel, with the same ArenaLimitError.

Cold: one continuation over the same action list. Before an action it pins the prepared objects the
action reads; a missing one gets its producer ensured and promoted to critical, and the continuation
yields (``resume_after``) until that producer completes, then resumes at the same action. After an
object's last use in the run it is unpinned (so a residency budget may evict it). Under a budget the
continuation also keeps a look-ahead window of prefetches ahead of it.

:class:`Inference` knows the plan, the session state, the producers and the scheduler, never the
session object: the session binds feeds and hands the values here.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from onnx_prepared.kernels import threads
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan
from onnx_prepared.prepared import EntryState
from onnx_prepared.resolve import PreparedKey
from onnx_prepared.runtime.context import RuntimeContext
from onnx_prepared.runtime.producers import FAILED_STATES, REFUSED, Producers, producer_error
from onnx_prepared.runtime.state import ExecutionSubmission, PrefetchWindow, PreparedExecutionState
from onnx_prepared.scheduler import ExecutionHandle, Priority, Resource, RuntimeScheduler, Task

#: Test/diagnostic hook: ``fn(action_index)`` after each action the cold path executes.
on_cold_action: Callable[[int], None] | None = None


class Inference:
    """Submits runs and executes their hot and cold paths. Thread-safe: per-run state lives in the
    :class:`ExecutionSubmission`; shared state in the store (its lock), the window (its lock) and the
    counters (increments only)."""

    def __init__(self, plan: PreparedExecutionPlan, state: PreparedExecutionState, producers: Producers,
                 scheduler: RuntimeScheduler, *, intra_op_threads: int, blas_threads: int | None) -> None:
        self.plan = plan
        self.state = state
        self.store = state.store
        self.producers = producers
        self.scheduler = scheduler
        # Threads one kernel call may use (native pool, BLAS); fewer while preparation holds CPU slots.
        self.intra_op_threads = intra_op_threads
        # OpenBLAS's thread count, the same for every run (None: kernels.threads.DEFAULT_BLAS_THREADS)
        self.blas_threads = blas_threads
        self.counters: Counter[str] = Counter()  # "hot_runs", "cold_runs", "yields"
        # look-ahead window (requirements ahead of the run) used under a residency budget
        self.window = PrefetchWindow(8, len(plan.requirements))
        self._hot: tuple[int, list] | None = None  # (epoch, value template with every object resident)
        producers.on_evict = self._evicted

    # ---- submission ----
    def submit(self, values: list, overridden: frozenset[int], context: RuntimeContext | None, *,
               inline: bool) -> ExecutionHandle:
        """One run over ``values`` (feeds bound). ``inline`` (used by ``run``, which waits anyway) runs a
        hot run as an inline task on the calling thread: the same task, lease and replay without the
        hand-off to a CPU worker (25-55 us per run measured). A cold run always goes to the CPU workers:
        it yields."""
        sub = ExecutionSubmission(self.state.next_invocation_id(), values, context)
        sub.held.update(overridden)
        store = self.store
        epoch = store.epoch
        if store.hot_epoch == epoch and store.acquire_lease(epoch):
            sub.hot = True
            for s, v in enumerate(self._hot_template()):
                if v is not None and values[s] is None:
                    values[s] = v
            self.counters["hot_runs"] += 1
            task = Task(lambda t: self._run_hot(sub), resource=Resource.INLINE if inline else Resource.CPU,
                        priority=Priority.CRITICAL, name=f"I.run-{sub.invocation_id}")
            return self.scheduler.submit(task, result=lambda: self._outputs(sub), keepalive=sub)
        self.counters["cold_runs"] += 1
        task = Task(lambda t: self._run_cold(t, sub), resource=Resource.CPU, priority=Priority.CRITICAL,
                    name=f"I.run-{sub.invocation_id}")
        self.scheduler.when_done(task, lambda t: self._release(sub))
        # Start the producers this run needs now, so reads and prepacks overlap the first nodes; the run
        # binds to the generations current now (spec: RunAsync step 4) and waits only at the consuming
        # node. Under a budget only the look-ahead window is started.
        if self.producers.residency.limited:
            self._prefetch(0)
        else:
            chains: list = []  # created first, started together: shared source reads stay shared
            for b, r in enumerate(self.plan.requirements):
                if b not in sub.held:
                    p = self.producers.ensure(r.key, Priority.PREFETCH, defer=chains)
                    if p is not None:
                        sub.bound[b] = p
            self.producers.start(chains)
        return self.scheduler.submit([task], result=lambda: self._outputs(sub), keepalive=sub)

    # ---- the hot path ----
    def _run_hot(self, sub: ExecutionSubmission) -> None:
        """The lease was taken at submission; replay everything; release it."""
        threads.bind(self.intra_op_threads, self.scheduler, blas=self.blas_threads)
        try:
            scratch = self.state.arenas.execution.acquire(self.state.execution_peak, "activations of a hot run")
            try:
                self.plan.execution.replay(sub.values)
            finally:
                scratch.release()
        finally:
            self.store.release_lease()
        _carry(sub, self.plan)

    # ---- the cold path ----
    def _run_cold(self, task: Task, sub: ExecutionSubmission):
        """The cold path continuation (see the module docstring). Returns a Resume to yield."""
        # Preparation may hold CPU slots meanwhile: kernels use only the threads it leaves (kernels.threads).
        threads.bind(self.intra_op_threads, self.scheduler, blas=self.blas_threads)
        plan = self.plan
        actions = plan.execution.actions
        needs = plan.action_requirements
        last_need = plan.last_need
        reqs = plan.requirements
        slots = plan.requirement_slots
        values = sub.values
        store = self.store
        producers = self.producers
        limited = producers.residency.limited
        token = task.token
        allocs = sub.allocations
        arena = self.state.arenas.execution
        n_actions = len(actions)
        # pc == n_actions is one more step with no action: it pins the requirements that are graph outputs
        # (an initializer returned as is may be read by no action at all; it was returned as None).
        while sub.pc <= n_actions:
            pc = sub.pc
            missing = None
            for b in (needs[pc] if pc < n_actions else plan.output_requirements):
                if b in sub.held:
                    continue
                key = reqs[b].key
                value = store.try_pin(key, pc)  # None: not resident (never was, or evicted just now)
                if value is not None:
                    values[slots[b]] = value
                    sub.held.add(b)
                    sub.pinned[b] = key
                    if limited:
                        self._prefetch(pc)
                    continue
                missing = b
                break
            if missing is not None:
                key = reqs[missing].key
                producer = sub.bound.pop(missing, None)
                if producer is not None and producer.state in FAILED_STATES:
                    raise producer_error(producer)  # the generation this run bound to failed
                if producer is None or producer.done:  # evicted since, or never bound: a new generation
                    producer = producers.ensure(key, Priority.CRITICAL, pc)
                    if producer is None:  # published meanwhile: check again
                        continue
                self.scheduler.promote(producer, Priority.CRITICAL)
                sub.yields += 1
                self.counters["yields"] += 1
                self.window.grow()  # I/O is slower than compute: look further
                return task.resume_after(producer)
            if pc == n_actions:
                break
            token.check()
            act = actions[pc]
            args = [values[i] for i in act.inputs]
            try:
                res = act.kernel.call(*args)
                for slot, v in zip(act.outputs, res):
                    values[slot] = v
                    old = allocs.pop(slot, None)
                    if old is not None:  # an omitted optional output shares one scratch slot
                        old.release()
                        sub.live_bytes -= old.nbytes
                    nb = getattr(v, "nbytes", 0)
                    if nb:
                        allocs[slot] = arena.acquire(nb, "activation")
                        sub.live_bytes += nb
                        if sub.live_bytes > sub.peak_bytes:
                            sub.peak_bytes = sub.live_bytes
            except Exception as e:
                raise plan.execution.kernel_error(act, args, e) from e
            for slot in act.release:
                values[slot] = None
                a = allocs.pop(slot, None)
                if a is not None:
                    a.release()
                    sub.live_bytes -= a.nbytes
            for b in needs[pc]:  # unpin after the last use in this run
                if last_need[b] == pc and b in sub.pinned:
                    store.unpin(sub.pinned.pop(b))
                    values[slots[b]] = None
            sub.pc = pc + 1
            if on_cold_action is not None:
                on_cold_action(pc)
        self.state.note_execution_peak(sub.peak_bytes)
        _carry(sub, plan)
        return None

    def _prefetch(self, position: int) -> None:
        """Ensure the next ``window.size`` requirements in plan order (wrapping into the next run).

        The window grows when the run had to wait (I/O slower than compute) and halves when residency
        refuses a prefetch (the budget is near).
        """
        reqs = self.plan.requirements
        order = self.plan.need_order
        n = len(order)
        start = self.plan.need_index(position)
        for i in range(min(self.window.size, n)):
            key = reqs[order[(start + i) % n]].key
            if self.store.state(key) is EntryState.RESIDENT:
                continue
            if self.producers.ensure(key, Priority.PREFETCH, position) is REFUSED:
                self.window.shrink()
                return

    def _release(self, sub: ExecutionSubmission) -> None:
        """Cleanup that always runs when a cold run ends (success, failure or cancel): pins, scratch."""
        for key in sub.pinned.values():
            self.store.unpin(key)
        sub.pinned.clear()
        for a in sub.allocations.values():
            a.release()
        sub.allocations.clear()

    # ---- values ----
    def _evicted(self, key: PreparedKey) -> None:
        self._hot = None  # the template must not keep an evicted object alive

    def _hot_template(self) -> list:
        hot = self._hot
        store = self.store
        if hot is None or hot[0] != store.epoch:
            template = [None] * self.plan.execution.n_slots
            for r, slot in zip(self.plan.requirements, self.plan.requirement_slots):
                if slot >= 0:
                    template[slot] = store.get(r.key)
            hot = self._hot = (store.epoch, template)
        return hot[1]

    def _outputs(self, sub: ExecutionSubmission) -> list:
        """The run's outputs; their bytes move to the IOArena until the caller drops them."""
        vals = sub.values
        outs = [vals[s] for s in self.plan.execution.output_slots]
        nbytes = sum(int(getattr(o, "nbytes", 0)) for o in outs)
        if nbytes:
            alloc = self.state.arenas.io.acquire(nbytes, f"outputs of run {sub.invocation_id}")
            owner = next((o for o in outs if hasattr(o, "nbytes")), None)
            try:
                weakref.finalize(owner, alloc.release)
            except TypeError:
                alloc.release()
        sub.values = []
        return outs


def _carry(sub: ExecutionSubmission, plan: PreparedExecutionPlan) -> None:
    """A successful run rebinds its context's carried inputs to its outputs (a KV cache)."""
    ctx: Any = sub.context
    if ctx is not None and ctx.carry:
        ctx.rebind(plan.execution.slot_names, plan.execution.output_slots, sub.values)
