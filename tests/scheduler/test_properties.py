"""Property-based tests: random DAGs with random resources, priorities, memory charges, work, failures,
shared tasks across submissions, and cancellations before and during the run.

Every example checks, from instrumentation inside task bodies and the scheduler's audit hooks: no task starts
before its dependencies succeeded; slot and memory budgets hold at every dispatch and every charge; every
submission reaches exactly one terminal state consistent with what happened; cancelled and suppressed tasks
never ran; nothing deadlocks (a generous wait bound fails the test instead of hanging it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_prepared.errors import Cancelled
from onnx_prepared.scheduler import (
    CpuExecutor,
    Domain,
    HandleState,
    MemoryBudget,
    MemoryEstimate,
    Priority,
    Resource,
    RuntimeScheduler,
    Task,
    TaskState,
)

from .conftest import TIMEOUT

RESOURCES = ("io", "cpu", "inline", "device:d0")
SLOTS = {"io": (3, 1), "cpu": (2, 1), "device:d0": (2, 1)}
TOTAL, RESERVE, DOMAIN_LIMIT = 100, 20, 60
SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Spec:
    deps: list[list[int]]
    resource: list[str]
    priority: list[int]
    charge: list[int]
    domain: list[Domain]
    work: list[int]
    fails: list[bool]
    subs: list[list[int]]  # roots of each submission
    fail_fast: list[bool]
    pre_cancel: list[bool]  # cancelled before the gate opens
    resubmit: bool  # after the pre-cancels, a new submission wants the first cancelled one's roots (C8 revival)
    during: dict[int, list[int]] = field(default_factory=dict)  # task index -> submissions its body cancels


@st.composite
def specs(draw, max_tasks: int = 24) -> Spec:
    n = draw(st.integers(1, max_tasks))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    k = draw(st.integers(1, 4))
    subs = [sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=4))) for _ in range(k)]
    during: dict[int, list[int]] = {}
    for s in range(k):
        if draw(st.integers(0, 4)) == 0:
            during.setdefault(draw(st.integers(0, n - 1)), []).append(s)
    return Spec(
        deps=deps,
        resource=[draw(st.sampled_from(RESOURCES)) for _ in range(n)],
        priority=[draw(st.integers(0, 2)) for _ in range(n)],
        charge=[draw(st.sampled_from([0, 0, 5, 20, 40])) for _ in range(n)],
        domain=[draw(st.sampled_from(list(Domain))) for _ in range(n)],
        work=[draw(st.sampled_from([0, 100, 3000])) for _ in range(n)],
        fails=[draw(st.integers(0, 9)) == 0 for _ in range(n)],
        subs=subs,
        fail_fast=[draw(st.booleans()) for _ in range(k)],
        pre_cancel=[draw(st.integers(0, 4)) == 0 for _ in range(k)],
        resubmit=draw(st.booleans()),
        during=during,
    )


class Recorder:
    """Instrumentation shared by task bodies and audit hooks; violations are collected, asserted at the end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.started: list[int] = []
        self.active = dict.fromkeys(SLOTS, 0)

    def bad(self, msg: str) -> None:
        with self.lock:
            self.violations.append(msg)

    def memory_audit(self, event: str, domain: Domain, nbytes: int, critical: bool, b: MemoryBudget) -> None:
        if event != "acquire":
            return
        if b.used() > TOTAL or b.used(domain) > DOMAIN_LIMIT:
            self.bad(f"memory over budget: total={b.used()} {domain.value}={b.used(domain)}")
        if not critical and b.used() > TOTAL - RESERVE:
            self.bad(f"non-critical charge entered the critical reserve: total={b.used()}")

    def slot_audit(self, task: Task, q) -> None:
        if q.running > q.slots or q.noncritical > q.noncritical_limit:
            self.bad(f"{q.name}: running={q.running}/{q.slots} noncritical={q.noncritical}/{q.noncritical_limit}")


def closure(spec: Spec, roots: list[int]) -> set[int]:
    out: set[int] = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i not in out:
            out.add(i)
            stack.extend(spec.deps[i])
    return out


def run_spec(spec: Spec) -> None:
    rec = Recorder()
    budget = MemoryBudget(TOTAL, limits=dict.fromkeys(Domain, DOMAIN_LIMIT), critical_reserve=RESERVE,
                          audit=rec.memory_audit)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=3, io_reserved=1,
                             devices={"d0": (2, 1)}, memory=budget, audit=rec.slot_audit, name="prop")
    handles: list = []
    cancelled_subs: set[int] = set()
    gate = threading.Event()
    n = len(spec.deps)
    tasks: list[Task] = []

    def body_for(i: int):
        def body(t: Task):
            with rec.lock:
                rec.started.append(i)
                if t.resource in rec.active:
                    rec.active[t.resource] += 1
                    if rec.active[t.resource] > SLOTS[t.resource][0]:
                        rec.violations.append(f"{t.resource} over its slots")
            for d in t.dependencies:
                if d.state is not TaskState.SUCCEEDED:
                    rec.bad(f"task {i} started before dependency {d.name} succeeded ({d.state.name})")
            x = 0
            for j in range(spec.work[i]):
                x += j
            for s in spec.during.get(i, ()):
                with rec.lock:
                    cancelled_subs.add(s)
                handles[s].cancel()
            with rec.lock:
                if t.resource in rec.active:
                    rec.active[t.resource] -= 1
            if spec.fails[i]:
                raise ValueError(f"task {i} failed")
            return i

        return body

    gate_task = Task(lambda t: gate.wait(TIMEOUT), resource=Resource.IO, name="gate")
    for i in range(n):
        deps = [tasks[j] for j in spec.deps[i]] or [gate_task]
        tasks.append(Task(body_for(i), deps=deps, resource=spec.resource[i], priority=spec.priority[i],
                          memory=MemoryEstimate(spec.domain[i], output=spec.charge[i]), name=f"t{i}"))
    done_calls = [0] * len(spec.subs)
    try:
        for s, roots in enumerate(spec.subs):
            h = sched.submit([tasks[i] for i in roots], fail_fast=spec.fail_fast[s])
            h.add_done_callback(lambda hh, s=s: done_calls.__setitem__(s, done_calls[s] + 1))
            handles.append(h)
        pre = [s for s, c in enumerate(spec.pre_cancel) if c]
        for s in pre:
            handles[s].cancel()
            cancelled_subs.add(s)
        again = None
        if spec.resubmit and pre:
            again = sched.submit([tasks[i] for i in spec.subs[pre[0]]], fail_fast=spec.fail_fast[pre[0]])
        gate.set()
        for h in [*handles, again] if again is not None else handles:
            try:
                h.wait(TIMEOUT)
            except TimeoutError:
                raise AssertionError(f"deadlock: {h!r} not terminal after {TIMEOUT} s; {sched.stats()}") from None
            except (ValueError, Cancelled):
                pass
    finally:
        gate.set()
        sched.close(cancel=True)

    assert rec.violations == []
    # No task ran twice; every attached task is terminal once every submission is.
    assert len(rec.started) == len(set(rec.started))
    wanted = set().union(*(closure(spec, r) for r in spec.subs))
    for i in wanted:
        assert tasks[i].state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.SUPPRESSED, TaskState.CANCELLED)
    started = set(rec.started)
    for i in range(n):
        st_ = tasks[i].state
        if st_ in (TaskState.SUPPRESSED, TaskState.CANCELLED):  # bodies never raise Cancelled themselves
            assert i not in started, f"t{i} is {st_.name} but its body ran"
        if st_ is TaskState.FAILED:
            assert spec.fails[i] and i in started
        if st_ is TaskState.SUCCEEDED:
            assert i in started and tasks[i].result == i
    # Tasks every interested submission cancelled before the gate opened never started (unless revived).
    pre_set = {s for s, c in enumerate(spec.pre_cancel) if c}
    revived = closure(spec, spec.subs[pre[0]]) if again is not None else set()
    for i in range(n):
        interested = {s for s, r in enumerate(spec.subs) if i in closure(spec, r)}
        if interested and interested <= pre_set and i not in revived:
            assert i not in started, f"t{i} started although every submission wanting it was cancelled"
    if again is not None:  # nobody cancels the resubmission: revived tasks ran to a real outcome
        failing = any(spec.fails[i] for i in revived)
        assert again.status is (HandleState.FAILED if failing else HandleState.SUCCEEDED), again.diagnostics
    # Exactly one terminal state, consistent with what happened.
    assert done_calls == [1] * len(spec.subs)
    for s, h in enumerate(handles):
        c = closure(spec, spec.subs[s])
        assert h.status in (HandleState.SUCCEEDED, HandleState.FAILED, HandleState.CANCELLED)
        failing = any(spec.fails[i] for i in c)
        d = h.diagnostics
        if s in pre_set:
            assert h.status is HandleState.CANCELLED
        elif s not in cancelled_subs:
            assert h.status is (HandleState.FAILED if failing else HandleState.SUCCEEDED), (s, h.status, d)
        if h.status is HandleState.FAILED:
            assert d.errors and isinstance(d.errors[0], ValueError) and d.failing_task is not None
            assert d.failing_task.state is TaskState.FAILED and int(d.failing_task.name[1:]) in c
        if h.status is HandleState.SUCCEEDED:
            assert all(tasks[i].state is TaskState.SUCCEEDED for i in c)
    st_ = sched.stats()
    assert st_["memory"]["total"] == 0 and st_["live_submissions"] == 0
    assert all(r["running"] == 0 and r["noncritical"] == 0 for r in st_["resources"].values())


@SETTINGS
@given(specs())
def test_random_dags_respect_dependencies_budgets_and_terminal_states(spec):
    run_spec(spec)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    chain=st.lists(st.tuples(st.sampled_from(RESOURCES), st.sampled_from([0, 5, RESERVE])), min_size=1, max_size=8),
    flood=st.integers(1, 4),
)
def test_critical_chains_finish_while_background_floods_every_queue(chain, flood):
    """Background tasks block on a gate the test holds, on every resource and up to the non-critical memory
    limit; a critical chain must still complete (reserved slots and the reserved memory slice)."""
    budget = MemoryBudget(TOTAL, critical_reserve=RESERVE)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=3, io_reserved=1,
                             devices={"d0": (2, 1)}, memory=budget, name="flood")
    gate = threading.Event()
    try:
        per = (TOTAL - RESERVE) // (flood * 3)
        bg = [Task(lambda t: gate.wait(TIMEOUT), resource=r, priority=Priority.BACKGROUND,
                   memory=MemoryEstimate(output=per)) for r in ("io", "cpu", "device:d0") for _ in range(flood + 2)]
        bg += [Task(lambda t: gate.wait(TIMEOUT), resource="io", priority=Priority.PREFETCH) for _ in range(4)]
        hb = sched.submit(bg)
        tasks: list[Task] = []
        for k, (r, charge) in enumerate(chain):
            tasks.append(Task(lambda t, k=k: k, deps=tasks[-1:], resource=r, memory=MemoryEstimate(output=charge)))
        h = sched.submit(tasks, result=tasks[-1])
        assert h.result(TIMEOUT) == len(chain) - 1
        assert not gate.is_set() and not hb.is_ready()
    finally:
        gate.set()
        sched.close()
    hb.wait(TIMEOUT)
