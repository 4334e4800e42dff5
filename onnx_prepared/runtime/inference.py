"""Inference: one run's two paths over the plan, hot and cold, executed through an ExecutionFrame.

Hot (every prepared object resident, readiness epoch unchanged at submission): the run takes one
run-level lease at submission and replays the whole action list through its frame
(:meth:`Inference._submit_hot` is the whole path: epoch check, lease, ``frame.replay()``, release).

Cold: one continuation over the plan's invocation ranges (the invocation task descriptors). Before a
range it pins the prepared objects the range reads; a missing one gets its producer ensured and
promoted to critical, and the continuation yields (``resume_after``) until that producer completes,
then resumes at the same range. After an object's last use in the run it is unpinned (so a residency
budget may evict it). Under a budget the continuation also keeps a look-ahead window of prefetches
ahead of it.

Source forms: a requirement whose PrepackSpec has ``source_form`` (4-bit MatMulNBits) is not waited for.
While it is not resident, the run hands its consumers a SourceForm of its source reads (waiting only for
those reads), and the kernel packs them per call (a few panels per intra-op task, into per-thread
scratch: kernels/matmul_nbits.py matmul_nbits_source), with the prepared path's bits.
A cold run starts only the source reads of such objects; their prepacks start when it ends, so the first
run does not share its cores with them (``$ONNX_PREPARED_SOURCE_FORMS=0``: wait for the prepacks instead).
A later cold run waits for a prepack already running rather than packing the same weights per call.

:class:`Inference` knows the plan, the session state, the producers and the scheduler, never the
session object: the session binds feeds and hands the values here. Tracing wraps the plan from
outside (:meth:`Inference.trace_actions`); neither path has a hook.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from onnx_prepared.bind import ExecutionPlan
from onnx_prepared.errors import Cancelled
from onnx_prepared.kernels import threads
from onnx_prepared.kernels.prepack import SourceForm
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan
from onnx_prepared.prepared import EntryState
from onnx_prepared.resolve import PreparedKey
from onnx_prepared.resolve.rows import RowView
from onnx_prepared.runtime.context import RuntimeContext
from onnx_prepared.runtime.frame import ExecutionFrame
from onnx_prepared.runtime.producers import FAILED_STATES, REFUSED, Producers, producer_error, weakly
from onnx_prepared.runtime.row_hints import feed_gathers, hint_rows
from onnx_prepared.runtime.state import PrefetchWindow, PreparedExecutionState
from onnx_prepared.scheduler import ExecutionHandle, Priority, Resource, RuntimeScheduler, Task, TaskState

#: What handing a run to a CPU worker and waking the waiter costs (25-55 us measured): a hot run whose
#: last replay was shorter runs on the submitting thread even for ``run_async``.
HANDOFF_SECONDS = 50e-6


class Inference:
    """Submits runs and executes their hot and cold paths. Thread-safe: per-run state lives in the
    :class:`ExecutionFrame`; shared state in the store (its lock), the window (its lock) and the
    counters (increments only)."""

    def __init__(self, plan: PreparedExecutionPlan, state: PreparedExecutionState, producers: Producers,
                 scheduler: RuntimeScheduler, *, intra_op_threads: int, blas_threads: int | None) -> None:
        self.plan = plan
        self.state = state
        self.store = state.store
        self.producers = producers
        self.scheduler = scheduler
        self.execution: ExecutionPlan = plan.execution  # what both paths replay (a traced copy while tracing)
        # Threads one kernel call may use (native pool, BLAS); fewer while preparation holds CPU slots.
        self.intra_op_threads = intra_op_threads
        # OpenBLAS's thread count, the same for every run (None: kernels.threads.DEFAULT_BLAS_THREADS)
        self.blas_threads = blas_threads
        self.counters: Counter[str] = Counter()  # "hot_runs", "cold_runs", "yields"
        # submitted runs not yet terminal (RuntimeSession.close waits for them); the done callback
        # holds this object weakly
        self._live: set[ExecutionHandle] = set()
        self._forget = weakly(self._live_discard)
        # look-ahead window (requirements ahead of the run) used under a residency budget
        self.window = PrefetchWindow(8, len(plan.requirements))
        self.hot_seconds = float("inf")  # the last hot replay's duration (unknown: hand it off)
        # id of a weak reference to a run's first output -> (that reference, the bytes of the run's
        # outputs held in the IOArena), unheld when the output dies (arrays are unhashable: the key is
        # the ref's id)
        self._out_refs: dict[int, tuple[weakref.ref, int]] = {}
        self._io = state.arenas.io
        # the weak references' callback, built once; it holds the dict and the arena, not self (no cycle)
        self._dropped = _outputs_dropped(self._out_refs, self._io)
        self._execution_arena = state.arenas.execution
        self._output_slots = plan.execution.output_slots
        self._hot: tuple[int, list] | None = None  # (epoch, (slot, object) of every resident requirement)
        bit = {r.key: b for b, r in enumerate(plan.requirements)}
        n = len(plan.execution.actions)
        # The cold path's segments: each invocation task's action range and the requirement bits it
        # reads, then one empty range at the end pinning the requirements that are graph outputs (an
        # initializer returned as is may be read by no action at all).
        self._need_index = {b: i for i, b in enumerate(plan.need_order)}
        self._segments = tuple((*t.actions, tuple(bit[k] for k in t.prepared_requirements))
                               for t in plan.invocation_tasks) + ((n, n, plan.output_requirements),)
        producers.on_evict = weakly(self._evicted)  # (producers is held by self: no cycle through it)
        # Source forms (PrepackSpec.source_form): bit -> its source names. While such an object is not
        # resident, a cold run hands its consumers the source reads (a SourceForm) instead of waiting for
        # its prepack, which starts when the run ends (_hold_prepacks); later runs take the prepared
        # object. The kernel gives the same bits either way.
        self._transient: dict[int, tuple[str, ...]] = {}
        # the prepacks a cold run holds back until it ends (_hold_prepacks): not started, so not waited for
        self._held: set[Task] = set()
        if source_forms_enabled():
            for b, r in enumerate(plan.requirements):
                spec = r.spec
                if not r.key.is_raw and not r.cached and spec is not None and spec.source_form:
                    self._transient[b] = tuple(r.sources)
        # Row tables (resolve/rows.py): bit -> the view a cold run gathers rows through while the table is
        # not resident, and whether its whole read may wait behind everything else (no other consumer).
        self._row_views: dict[int, RowView] = {}
        self._row_background: set[int] = set()
        tables = plan.resolved.row_tables
        for b, r in enumerate(plan.requirements):
            table = tables.get(r.sources[0]) if r.key.is_raw else None
            entry = state.reader.manifest.active.get(r.sources[0]) if table is not None else None
            if entry is not None and entry.descriptor is not None:
                self._row_views[b] = RowView(entry.descriptor, state.reader.reader)
                if not table.whole_for:
                    self._row_background.add(b)
        # the nodes gathering rows by a feed: their rows are asked for as a cold run is submitted
        self._feed_gathers = feed_gathers(plan, {plan.requirements[b].sources[0]: v
                                                 for b, v in self._row_views.items()})

    @contextlib.contextmanager
    def trace_actions(self, after: Callable[[int], None]) -> Iterator[None]:
        """Within the block, both paths call ``after(action_index)`` once each action's kernel returned
        (runs submitted inside it; the plan is wrapped from outside, see ``ExecutionPlan.traced``)."""
        self.execution = self.plan.execution.traced(after)
        try:
            yield
        finally:
            self.execution = self.plan.execution

    # ---- submission ----
    def submit(self, values: list, overridden: frozenset[int], context: RuntimeContext | None, *,
               inline: bool) -> ExecutionHandle:
        """One run over ``values`` (feeds bound): hot when everything is resident, else cold.

        ``inline`` replays a hot run on the calling thread, with no scheduler task: the same lease and
        replay without the task round trip and the hand-off to a CPU worker. A cold run always goes to
        the CPU workers: it yields.
        """
        frame = self._frame(values, overridden, context)
        execution = self._enter_hot(frame)
        if execution is None:
            return self._submit_cold(frame)
        name = f"I.run-{frame.invocation_id}"
        if inline or self.hot_seconds < HANDOFF_SECONDS:
            return self.scheduler.run_here(lambda: self._replay_hot(frame, execution),
                                           result=lambda: self._outputs(frame), name=name)
        task = Task(lambda t: self._replay_hot(frame, execution), resource=Resource.CPU,
                    priority=Priority.CRITICAL, name=name)
        return self._track(self.scheduler.submit(task, result=lambda: self._outputs(frame), keepalive=frame))

    def _track(self, handle: ExecutionHandle) -> ExecutionHandle:
        self._live.add(handle)
        handle.add_done_callback(self._forget)
        return handle

    def _live_discard(self, handle: ExecutionHandle) -> None:
        self._live.discard(handle)

    def wait_runs(self) -> None:
        """Wait until every submitted run is terminal (their outcomes stay with their handles): a run
        still waits for the reads and prepacks it is bound to, which the session's close then would
        cancel under it."""
        for h in list(self._live):
            with contextlib.suppress(Exception, Cancelled):  # (not KeyboardInterrupt)
                h.wait()

    def run(self, values: list, overridden: frozenset[int], context: RuntimeContext | None) -> list:
        """``submit(..., inline=True).result()`` for a caller that waits anyway (``RuntimeSession.run``).

        A hot run is the spec's whole hot path and nothing else: epoch check, lease, replay on this
        thread, release, outputs; no handle and no frame are built (its outcome is the same: a kernel's
        exception propagates as is, and a ``Cancelled`` checkpoint goes through ``run_here`` to become
        the same ``CancelledError``). The first hot run, which measures the activation peak, and every
        run while tracing, go through the frame (:meth:`_replay_hot`, the traced inline task of
        :meth:`submit`).
        """
        store = self.store
        epoch = store.epoch
        peak = self.state.execution_peak
        if peak and store.hot_epoch == epoch and self.scheduler.trace is None and store.acquire_lease(epoch):
            return self._run_hot(values, context, peak)
        frame = self._frame(values, overridden, context)
        execution = self._enter_hot(frame)
        if execution is None:
            return self._submit_cold(frame).result()
        if self.scheduler.trace is not None:
            return self.scheduler.run_here(lambda: self._replay_hot(frame, execution),
                                           result=lambda: self._outputs(frame),
                                           name=f"I.run-{frame.invocation_id}").result()
        try:
            self._replay_hot(frame, execution)
        except Cancelled as e:
            return self.scheduler.run_here(_raiser(e), name=f"I.run-{frame.invocation_id}").result()
        return self._outputs(frame)

    def _run_hot(self, values: list, context: RuntimeContext | None, peak: int) -> list:
        """:meth:`run`'s hot path, the lease taken: :meth:`_replay_hot` on the values list itself (a
        frame, its records and its allocations cost ~25 us a run, more than a small CNN's kernels)."""
        run_id = self.state.next_invocation_id()
        execution = self.execution
        stopped = None
        try:
            for s, v in self._hot_values():
                if values[s] is None:
                    values[s] = v
            self.counters["hot_runs"] += 1
            threads.bind(self.intra_op_threads, self.scheduler, blas=self.blas_threads)  # _bind_threads()
            arena = self._execution_arena
            arena.hold(peak, lambda: f"activations of run {run_id}")
            try:
                t0 = time.perf_counter()
                execution.replay(values)
                self.hot_seconds = time.perf_counter() - t0
            finally:
                arena.unhold(peak)
        except Cancelled as e:
            stopped = e
        finally:
            self.store.release_lease()
        if stopped is not None:
            return self.scheduler.run_here(_raiser(stopped), name=f"I.run-{run_id}").result()
        self.state.reader.reader.check_verified()  # a no-op once every read was verified
        if context is not None and context.carry:
            context.rebind(execution.slot_names, execution.output_slots, values)
        return self._take_outputs(values, run_id)

    def _frame(self, values: list, overridden: frozenset[int], context: RuntimeContext | None) -> ExecutionFrame:
        frame = ExecutionFrame(self.state.next_invocation_id(), values, self.state.arenas.execution, context)
        if overridden:
            frame.held.update(overridden)
        return frame

    # ---- the hot path ----
    def _enter_hot(self, frame: ExecutionFrame) -> ExecutionPlan | None:
        """Epoch check and one run-level lease; the plan to replay, or None: not hot, run cold.

        With the lease taken, the resident objects fill the slots the caller fed nothing into.
        """
        store = self.store
        epoch = store.epoch
        if store.hot_epoch != epoch or not store.acquire_lease(epoch):
            return None
        values = frame.values
        for s, v in self._hot_values():
            if values[s] is None:
                values[s] = v
        self.counters["hot_runs"] += 1
        return self.execution

    def _replay_hot(self, frame: ExecutionFrame, execution: ExecutionPlan) -> None:
        """The hot run's body (the lease is taken): replay, release the lease, verify, carry."""
        self._bind_threads()
        t0 = time.perf_counter()
        try:
            self.state.note_execution_peak(frame.replay(execution, self.state.execution_peak))
        finally:
            self.store.release_lease()
        self.hot_seconds = time.perf_counter() - t0
        self.state.reader.reader.check_verified()  # a no-op once every read was verified
        frame.carry(execution)

    def _bind_threads(self) -> None:
        # Preparation may hold CPU slots meanwhile: kernels use only the threads it leaves (kernels.threads;
        # BLAS is set only when its count changes, the native pool only when its size does).
        threads.bind(self.intra_op_threads, self.scheduler, blas=self.blas_threads)

    def prepare_order(self) -> list[tuple[int, Priority]]:
        """Requirement bits in the order ``prepare_async`` submits them, each with its priority: need order,
        with the row tables last as on the cold path (:meth:`_submit_cold`): one read whole for another
        consumer after every other requirement, one only gathered from (untied, or its other consumer
        served by the companion) at background priority. A replica submits ``prepare_async`` beside its
        first run, which gathers rows and needs no table whole: on a hit, the tied INT4 table (20 MB)
        read whole first held an I/O worker for the first 22-45 ms of the run's reads."""
        order = self.plan.need_order
        return ([(b, Priority.PREFETCH) for b in self._rows_last(order)]
                + [(b, Priority.BACKGROUND) for b in order if b in self._row_background])

    def _rows_last(self, order: Iterable[int]) -> list[int]:
        """``order`` without the row tables read only by rows, and with those read whole for another
        consumer moved to the end (both orders of :meth:`prepare_order` and :meth:`_submit_cold`)."""
        order = list(order)
        rows, background = self._row_views, self._row_background
        return [b for b in order if b not in rows] + [b for b in order if b in rows and b not in background]

    # ---- the cold path ----
    def _submit_cold(self, frame: ExecutionFrame) -> ExecutionHandle:
        self.counters["cold_runs"] += 1
        if self._feed_gathers:  # before the producers' reads (runtime/row_hints.py)
            hint_rows(frame.values, self._feed_gathers)
        task = Task(lambda t: self._run_cold(t, frame), resource=Resource.CPU, priority=Priority.CRITICAL,
                    name=f"I.run-{frame.invocation_id}")
        self.scheduler.when_done(task, lambda t: self._release(frame))
        # Start the producers this run needs now, so reads and prepacks overlap the first nodes; the run
        # binds to the generations current now (spec: RunAsync step 4) and waits only at the consuming
        # range. Under a budget only the look-ahead window is started.
        if self.producers.residency.limited:
            self._prefetch(0)
        else:
            chains: list = []  # created first, started together: shared source reads stay shared
            # Row tables go last: whole for another consumer (after every other read), or after the run
            # (_release) when rows are all their consumers read.
            for b in self._rows_last(range(len(self.plan.requirements))):
                if b not in frame.held:
                    p = self.producers.ensure(self.plan.requirements[b].key, Priority.PREFETCH, defer=chains)
                    if p is not None:
                        frame.bound[b] = p
            if self._transient and chains:
                chains = self._hold_prepacks(frame, chains)
            self.producers.start(chains)
        return self._track(self.scheduler.submit([task], result=lambda: self._outputs(frame), keepalive=frame))

    def _hold_prepacks(self, frame: ExecutionFrame, chains: list) -> list:
        """Of the new chains, what starts now, in the same order: in place of the prepack (and persist) of
        an object this run computes in its source form, the source reads alone. Those prepacks start when
        the run ends (:meth:`_release`): on the first run they would take the cores the run computes on,
        and faulting in their fresh buffers costs more than the run's own scratch packs."""
        plan = self.plan
        reads: dict[str, list] = {}  # producer id -> its source reads
        persists: set[str] = set()
        for b, names in self._transient.items():
            if b in frame.bound:
                key = plan.requirements[b].key
                entries = [self.store.current_read(n) for n in names]
                reads[plan.producer[key]] = [e.task for e in entries if e is not None and e.task is not None]
                persists.add(plan.persister.get(key, ""))
        start, held = [], []
        for t in chains:
            if t.name in reads:
                held.append(t)
                start.extend(reads[t.name])
            elif t.name in persists:
                held.append(t)
            else:
                start.append(t)
        frame.late = held
        self._held.update(held)
        return list(dict.fromkeys(start))  # a source shared by two objects: one read

    def _run_cold(self, task: Task, frame: ExecutionFrame):
        """The cold path continuation (see the module docstring). Returns a Resume to yield."""
        execution = self.execution
        plan = self.plan
        needs = plan.action_requirements
        last_need = plan.last_need
        slots = plan.requirement_slots
        segments = self._segments
        store = self.store
        gauge = self.scheduler
        token = task.token
        while frame.segment < len(segments):
            start, stop, bits = segments[frame.segment]
            missing = self._pin(frame, bits, start)
            if missing is not None:
                resume = (self._wait_for(task, frame, missing, start) if type(missing) is int
                          else self._wait_read(task, missing))
                if resume is None:  # published meanwhile: pin again
                    continue
                return resume
            # Per segment, not per run: preparation starts and ends during a cold run, and the native
            # pool should use the cores it leaves (medium, 128 tokens, no yield: bound once, 183 of
            # 202 actions ran on one thread while preparation held a slot for 18 of them).
            # Within a segment too, between actions, whenever the slots preparation holds change: a run
            # that stops yielding early keeps one long segment (medium, 16 tokens, cold: 1.4 s from
            # layer 0's MLP to the logits), and preparation ended 0.55 s before it on one native thread.
            prep = gauge.cpu_preparation_running()
            self._bind_threads()
            forms = frame.forms
            while frame.pc < stop:
                token.check()
                pc = frame.pc
                frame.step(execution)
                for b in needs[pc]:  # unpin after the last use in this run
                    if last_need[b] == pc:
                        if b in frame.pinned:
                            store.unpin(frame.pinned.pop(b))
                            frame.values[slots[b]] = None
                        elif forms and forms.pop(b, None) is not None:
                            frame.values[slots[b]] = None
                if gauge.cpu_preparation_running() != prep:
                    prep = gauge.cpu_preparation_running()
                    self._bind_threads()
            frame.segment += 1
        self.state.note_execution_peak(frame.peak_bytes)
        # Weights may reach their consumers before their checksum is verified (model/verify.py): a run
        # that used bytes failing it raises here instead of returning a result computed from them.
        self.state.reader.reader.check_verified()
        frame.carry(execution)
        return None

    def _pin(self, frame: ExecutionFrame, bits: tuple[int, ...], position: int) -> int | Task | None:
        """Pin every requirement of a segment the run does not hold yet; None when all are there, else
        the first missing bit (wait for its producer) or the source read a source form waits for."""
        reqs = self.plan.requirements
        slots = self.plan.requirement_slots
        limited = self.producers.residency.limited
        for b in bits:
            if b in frame.held:
                continue
            key = reqs[b].key
            value = self.store.try_pin(key, position)  # None: not resident (never was, or evicted just now)
            if value is None:
                view = self._row_views.get(b)
                if view is not None:
                    frame.values[slots[b]] = view  # a row table: its consumers read the rows they need
                    continue
                form = frame.forms.get(b)
                if form is None:
                    names = self._transient.get(b)
                    if names is not None and self._prepack_running(key):
                        names = None  # wait for it: a source form would repeat its packing every call
                    wait = self._source_form(frame, b, names) if names is not None else b
                    if wait is not None:
                        return wait
                    form = frame.forms[b]
                frame.values[slots[b]] = form  # its consumers compute from the source arrays
                continue
            frame.forms.pop(b, None)  # resident now: the prepared form from here on
            frame.values[slots[b]] = value
            frame.held.add(b)
            frame.pinned[b] = key
            if limited:
                self._prefetch(position)
        return None

    def _prepack_running(self, key: PreparedKey) -> bool:
        """Whether ``key``'s prepack was started (by a run's end or ``prepare_async``) and is not done. A
        run after the first then waits for it, promoted, instead of taking the source form: the source
        form packs the weights again in each call, so the decode steps right after a cold prefill each
        repeated the prepacks still in flight (tiny, 16 tokens: 8 cold steps of 1.1-11.5 ms, 0.45 hot)."""
        t = self.store.producer(key)
        return t is not None and not t.done and t not in self._held

    def _source_form(self, frame: ExecutionFrame, bit: int, names: tuple[str, ...]) -> int | Task | None:
        """Take requirement ``bit``'s source form when its source reads are buffered (None); else the read
        to wait for, or ``bit`` itself (no read in flight: wait for its producer, as without a source form)."""
        arrays = []
        for name in names:
            entry = self.store.current_read(name)
            value = entry.value if entry is not None else None
            if value is None:
                read = entry.task if entry is not None else None
                return read if read is not None and not read.done else bit
            arrays.append(value)
        frame.forms[bit] = SourceForm(tuple(arrays))
        return None

    def _wait_read(self, task: Task, read: Task):
        """Yield until a source read a source form needs completes, promoted to critical (None: done)."""
        if read.done:
            return None
        self.scheduler.promote(read, Priority.CRITICAL)
        self.counters["yields"] += 1
        self.window.grow()
        return task.resume_after(read)

    def _wait_for(self, task: Task, frame: ExecutionFrame, bit: int, position: int):
        """Yield until the producer of requirement ``bit`` completes (the one bound at submission, or a
        new generation when that one is gone), promoted to critical; None when it was published meanwhile."""
        key = self.plan.requirements[bit].key
        producer = frame.bound.pop(bit, None)
        if producer is not None and producer.state in FAILED_STATES:
            raise producer_error(producer)  # the generation this run bound to failed
        if producer is None or producer.done:  # evicted since, or never bound: a new generation
            producer = self.producers.ensure(key, Priority.CRITICAL, position)
            if producer is None:
                return None
        self.scheduler.promote(producer, Priority.CRITICAL)
        if producer.state is TaskState.RUNNING and not key.is_raw:  # a prepack holding a CPU slot
            self._promote_next(frame, bit)
        self.counters["yields"] += 1
        self.window.grow()  # I/O is slower than compute: look further
        return task.resume_after(producer)

    def _promote_next(self, frame: ExecutionFrame, bit: int) -> None:
        """Promote the producers of the requirements needed after ``bit`` (bound, unfinished), up to and
        including the first one with a prepack; called while the run waits for a running prepack.

        Preparation gets the slots critical work does not reserve, so while the run waits the slot it
        leaves would idle. Promoted, the next prepack takes it: preparation then runs on every core
        while the run waits (twice the prepack throughput on 2 cores), and the run resumes on the slot
        of the prepack it waited for. (Waiting for a read, it promotes nothing ahead: a CPU slot taken
        meanwhile would delay its resumption.) Raw requirements on the way are promoted too: they cost
        a read, not a CPU slot.
        """
        reqs = self.plan.requirements
        order = self.plan.need_order
        for b in order[self._need_index.get(bit, len(order)) + 1:]:
            p = frame.bound.get(b)
            if p is None or p.done:
                continue
            self.scheduler.promote(p, Priority.CRITICAL)
            if not reqs[b].key.is_raw:
                return

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
            if order[(start + i) % n] in self._row_views:
                continue  # under a budget a row table is never read whole by the cold path
            key = reqs[order[(start + i) % n]].key
            if self.store.state(key) is EntryState.RESIDENT:
                continue
            if self.producers.ensure(key, Priority.PREFETCH, position) is REFUSED:
                self.window.shrink()
                return

    def _release(self, frame: ExecutionFrame) -> None:
        """Cleanup that always runs when a cold run ends (success, failure or cancel): pins, scratch."""
        for key in frame.pinned.values():
            self.store.unpin(key)
        frame.pinned.clear()
        frame.forms.clear()
        frame.release_allocations()
        if frame.late:  # the prepacks this run held back (_hold_prepacks): wanted for later runs
            late, frame.late = frame.late, []
            if not self.producers.closed:
                self.producers.start(late)
            self._held.difference_update(late)
        if self._row_background and not self.producers.closed and not self.producers.residency.limited:
            # Row tables read by rows in this run: now read them whole, behind everything else.
            for b in self._row_background:
                key = self.plan.requirements[b].key
                if self.store.state(key) is not EntryState.RESIDENT:
                    self.producers.ensure(key, Priority.BACKGROUND)

    # ---- values ----
    def _evicted(self, key: PreparedKey) -> None:
        self._hot = None  # the template must not keep an evicted object alive

    def _hot_values(self) -> list[tuple[int, Any]]:
        """(slot, resident object) of every requirement a run reads, cached per readiness epoch."""
        hot = self._hot
        store = self.store
        if hot is None or hot[0] != store.epoch:
            pairs = [(slot, store.get(r.key)) for r, slot in zip(self.plan.requirements, self.plan.requirement_slots)
                     if slot >= 0]
            hot = self._hot = (store.epoch, pairs)
        return hot[1]

    def _outputs(self, frame: ExecutionFrame) -> list:
        """The run's outputs (see :meth:`_take_outputs`); the frame keeps no reference to them."""
        outs = self._take_outputs(frame.values, frame.invocation_id)
        frame.values = []
        return outs

    def _take_outputs(self, values: list, run_id: int) -> list:
        """The outputs in ``values``; their bytes move to the IOArena until the caller drops them."""
        outs = [values[s] for s in self._output_slots]
        nbytes = 0
        owner = None
        for o in outs:
            n = o.nbytes if type(o) is np.ndarray else getattr(o, "nbytes", None)
            if n is not None:
                nbytes += int(n)
                if owner is None:
                    owner = o
        if nbytes:
            self._io.hold(nbytes, lambda: f"outputs of run {run_id}")
            try:
                ref = weakref.ref(owner, self._dropped)
            except TypeError:
                self._io.unhold(nbytes)
            else:  # a plain weak reference kept until it fires (weakref.finalize costs 5x more)
                self._out_refs[id(ref)] = (ref, nbytes)
        return outs



def _outputs_dropped(out_refs: dict, io: Any) -> Callable[[weakref.ref], None]:
    """The callback of a run's output weak reference: unhold the bytes recorded under it."""
    pop, unhold = out_refs.pop, io.unhold

    def dropped(ref: weakref.ref) -> None:
        entry = pop(id(ref), None)
        if entry is not None:
            unhold(entry[1])

    return dropped


#: ``$ONNX_PREPARED_SOURCE_FORMS=0``: cold runs wait for every prepack instead (A/B measurement)
SOURCE_FORMS_ENV = "ONNX_PREPARED_SOURCE_FORMS"


def source_forms_enabled() -> bool:
    """Whether cold runs compute from source forms (PrepackSpec.transient_pack) while prepacks run."""
    return os.environ.get(SOURCE_FORMS_ENV, "1") != "0"


def _raiser(e: BaseException) -> Callable[[], None]:
    def raise_() -> None:
        raise e

    return raise_
