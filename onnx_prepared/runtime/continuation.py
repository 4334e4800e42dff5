"""The two inference paths of one run.

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnx_prepared.kernels import threads
from onnx_prepared.prepared import EntryState
from onnx_prepared.runtime.producers import FAILED_STATES, REFUSED, producer_error
from onnx_prepared.runtime.state import ExecutionSubmission
from onnx_prepared.scheduler import Priority, Task

if TYPE_CHECKING:
    from collections.abc import Callable

    from onnx_prepared.runtime.session import RuntimeSession

#: Test/diagnostic hook: ``fn(action_index)`` after each action the cold path executes.
on_cold_action: Callable[[int], None] | None = None


def run_hot(session: RuntimeSession, task: Task, sub: ExecutionSubmission) -> None:
    """The hot path: the lease was taken at submission; replay everything; release it."""
    threads.bind(session.intra_op_threads, session.scheduler, blas=session.blas_threads)
    try:
        scratch = session.arenas.execution.acquire(session.state.execution_peak, "activations of a hot run")
        try:
            session.plan.execution.replay(sub.values)
        finally:
            scratch.release()
    finally:
        session.store.release_lease()


def run_cold(session: RuntimeSession, task: Task, sub: ExecutionSubmission):
    """The cold path continuation (see the module docstring). Returns a Resume to yield."""
    # Preparation may hold CPU slots meanwhile: kernels use only the threads it leaves (kernels.threads).
    threads.bind(session.intra_op_threads, session.scheduler, blas=session.blas_threads)
    plan = session.plan
    actions = plan.execution.actions
    needs = plan.action_requirements
    last_need = plan.last_need
    reqs = plan.requirements
    slots = plan.requirement_slots
    values = sub.values
    store = session.store
    producers = session.producers
    limited = producers.residency.limited
    token = task.token
    allocs = sub.allocations
    arena = session.arenas.execution
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
                    prefetch(session, sub, pc)
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
            session.scheduler.promote(producer, Priority.CRITICAL)
            sub.yields += 1
            session.counters["yields"] += 1
            session.window.grow()  # I/O is slower than compute: look further
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
    session.state.note_execution_peak(sub.peak_bytes)
    return None


def prefetch(session: RuntimeSession, sub: ExecutionSubmission, position: int) -> None:
    """Ensure the next ``session.window.size`` requirements in plan order (wrapping into the next run).

    The window grows when the run had to wait (I/O slower than compute) and halves when residency
    refuses a prefetch (the budget is near).
    """
    producers = session.producers
    reqs = session.plan.requirements
    order = session.need_order
    n = len(order)
    start = session.need_index(position)
    for i in range(min(session.window.size, n)):
        b = order[(start + i) % n]
        key = reqs[b].key
        if session.store.state(key) is EntryState.RESIDENT:
            continue
        if producers.ensure(key, Priority.PREFETCH, position) is REFUSED:
            session.window.shrink()
            return


def release_run(session: RuntimeSession, sub: ExecutionSubmission) -> None:
    """Cleanup that always runs when a cold run ends (success, failure or cancel): pins, scratch."""
    for key in sub.pinned.values():
        session.store.unpin(key)
    sub.pinned.clear()
    for a in sub.allocations.values():
        a.release()
    sub.allocations.clear()
