"""RuntimeScheduler: dependencies, resources and reserved slots, priorities and inheritance, memory admission,
dynamic graphs, callbacks, tracing. Ordering is proven with gates the test holds, never with sleeps."""

from __future__ import annotations

import json
import threading

import pytest

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

from .conftest import TIMEOUT, Gate

CRIT, PREF, BG = Priority.CRITICAL, Priority.PREFETCH, Priority.BACKGROUND


def mem(n: int, domain: Domain = Domain.PREPARATION) -> MemoryEstimate:
    return MemoryEstimate(domain, output=n)


# **** dependencies and results ****


def test_chain_across_resources_passes_results(make_scheduler):
    s = make_scheduler(devices={"d0": 1})
    a = Task(lambda t: 2, resource=Resource.IO, name="a")
    b = Task(lambda t: a.result * 3, deps=[a], name="b")
    c = Task(lambda t: b.result + 1, deps=[b], resource=Resource.device("d0"), name="c")
    d = Task(lambda t: c.result * 10, deps=[c], resource=Resource.INLINE, name="d")
    h = s.submit([d], result=d)
    assert h.result(TIMEOUT) == 70
    assert [x.state for x in (a, b, c, d)] == [TaskState.SUCCEEDED] * 4
    assert h.status is HandleState.SUCCEEDED


def test_diamond_runs_join_once_after_both_branches(sched):
    order: list[str] = []
    lock = threading.Lock()

    def rec(name):
        def fn(t):
            with lock:
                order.append(name)
            return name
        return fn

    a = Task(rec("a"))
    b = Task(rec("b"), deps=[a], resource=Resource.IO)
    c = Task(rec("c"), deps=[a])
    d = Task(rec("d"), deps=[b, c])
    sched.submit([d]).wait(TIMEOUT)
    assert order[0] == "a" and order[-1] == "d" and sorted(order[1:3]) == ["b", "c"] and len(order) == 4


def test_submitting_a_task_pulls_in_unsubmitted_dependencies(sched):
    a = Task(lambda t: 1)
    b = Task(lambda t: 2, deps=[a])
    h = sched.submit(b)
    h.wait(TIMEOUT)
    assert a.state is TaskState.SUCCEEDED and a in h._sub.members


def test_unknown_resource_and_foreign_task_are_rejected_before_anything_changes(make_scheduler):
    s1, s2 = make_scheduler(), make_scheduler()
    bad = Task(lambda t: 1, resource="gpu-that-is-not-there")
    with pytest.raises(ValueError, match="unknown resource"):
        s1.submit([bad])
    assert bad.state is TaskState.PENDING
    t = Task(lambda t: 1)
    s1.submit([t]).wait(TIMEOUT)
    u = Task(lambda x: 1, deps=[t])
    with pytest.raises(ValueError, match="another scheduler"):
        s2.submit([u])
    with pytest.raises(TypeError):
        s1.submit([lambda t: 1])  # type: ignore[list-item]
    assert s1.stats()["live_submissions"] == 0  # a rejected submission leaves nothing behind (close won't wait)


def test_task_rejects_bad_arguments():
    with pytest.raises(ValueError):
        Task(lambda t: 1, priority=7)
    with pytest.raises(TypeError):
        Task(lambda t: 1, deps=[object()])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        MemoryEstimate(Domain.IO, output=-1)
    t = Task(lambda t: 1)
    with pytest.raises(RuntimeError, match="no result"):
        _ = t.result
    with pytest.raises(RuntimeError, match="only valid inside"):
        t.resume_after(t)
    with pytest.raises(RuntimeError, match="only valid inside"):
        t.retain(1)


def test_task_state_machine_rejects_illegal_transitions():
    from onnx_prepared.errors import InternalError

    t = Task(lambda t: 1)
    with pytest.raises(InternalError, match="PENDING -> SUCCEEDED"):
        t._transition(TaskState.SUCCEEDED)
    t._transition(TaskState.READY)
    t._transition(TaskState.RUNNING)
    t._transition(TaskState.SUCCEEDED)
    with pytest.raises(InternalError):
        t._transition(TaskState.RUNNING)
    assert "SUCCEEDED" in repr(t)


# **** slots and priorities ****


def test_reserved_cpu_slot_runs_critical_work_while_background_fills_the_rest(sched):
    gate = Gate()
    bg = [Task(gate.body(), priority=BG, name=f"bg{i}") for i in range(3)]
    hb = sched.submit(bg)
    assert gate.started.wait(TIMEOUT)
    st = sched.stats()["resources"]["cpu"]
    assert st["running"] == 1 and st["noncritical"] == 1  # preparation may use only the unreserved slot
    crit = Task(lambda t: "ran", priority=CRIT)
    assert sched.submit([crit], result=crit).result(TIMEOUT) == "ran"
    assert gate.entered == 1
    gate.open()
    hb.wait(TIMEOUT)


def test_background_writes_never_delay_critical_reads(make_scheduler):
    s = make_scheduler(io_workers=3, io_reserved=1)
    gate = Gate()
    writes = [Task(gate.body(), resource=Resource.IO, priority=BG, name=f"write{i}") for i in range(6)]
    hw = s.submit(writes)
    assert gate.started.wait(TIMEOUT)
    read = Task(lambda t: b"bytes", resource=Resource.IO, priority=CRIT, name="read")
    assert s.submit([read], result=read).result(TIMEOUT) == b"bytes"
    assert s.stats()["resources"]["io"]["noncritical"] == 2
    gate.open()
    hw.wait(TIMEOUT)


def test_more_urgent_classes_dispatch_first_then_fifo(make_scheduler):
    s = make_scheduler(cpu_workers=1, cpu_reserved=0)
    gate = Gate()
    blocker = Task(gate.body(), name="blocker")
    hb = s.submit([blocker])
    assert gate.started.wait(TIMEOUT)
    order: list[str] = []
    tasks = []
    for i, p in enumerate([BG, CRIT, PREF, BG, CRIT, PREF]):
        name = f"{p.name.lower()}{i}"
        tasks.append(Task(lambda t, n=name: order.append(n), priority=p, name=name))
    h = s.submit(tasks)
    gate.open()
    h.wait(TIMEOUT)
    hb.wait(TIMEOUT)
    assert order == ["critical1", "critical4", "prefetch2", "prefetch5", "background0", "background3"]


def test_critical_work_depending_on_a_queued_background_chain_promotes_it(sched):
    gate = Gate()
    hold = sched.submit([Task(gate.body(), priority=BG, name="holder")])
    assert gate.started.wait(TIMEOUT)
    a = Task(lambda t: 1, priority=BG, name="a")
    b = Task(lambda t: a.result + 1, deps=[a], priority=BG, name="b")
    other = Task(lambda t: 0, priority=BG, name="other")
    hq = sched.submit([b, other])
    # a and other are queued behind the holder (one preparation slot); b waits for a.
    assert a.state is TaskState.READY and other.state is TaskState.READY and b.state is TaskState.PENDING
    c = Task(lambda t: b.result * 10, deps=[b], priority=CRIT, name="c")
    assert b.priority is BG and a.priority is BG  # nothing promoted before a critical consumer exists
    hc = sched.submit([c], result=c)
    assert a.priority is CRIT and b.priority is CRIT
    assert hc.result(TIMEOUT) == 20  # ran in the reserved slot while the holder still blocks
    assert other.state is TaskState.READY  # not promoted: nothing critical needs it
    gate.open()
    hq.wait(TIMEOUT)
    hold.wait(TIMEOUT)


def test_promote_moves_a_queued_producer_chain(sched):
    gate = Gate()
    hold = sched.submit([Task(gate.body(), priority=BG)])
    assert gate.started.wait(TIMEOUT)
    a = Task(lambda t: "w", priority=BG, name="read")
    b = Task(lambda t: a.result + "!", deps=[a], priority=PREF, name="prepack")
    h = sched.submit([b], result=b)
    assert not h.is_ready()
    sched.promote(b, CRIT)
    assert a.priority is CRIT
    assert h.result(TIMEOUT) == "w!"
    gate.open()
    hold.wait(TIMEOUT)


def test_submit_priority_promotes_the_closure(sched):
    a = Task(lambda t: 1, priority=BG)
    b = Task(lambda t: 2, deps=[a], priority=BG)
    sched.submit([b], priority=CRIT).wait(TIMEOUT)
    assert a.priority is CRIT and b.priority is CRIT


def test_slot_audit_sees_every_dispatch(make_scheduler):
    seen: list[tuple[str, int, int]] = []

    def audit(task, q):
        seen.append((q.name, q.running, q.noncritical))
        assert q.running <= q.slots and q.noncritical <= q.noncritical_limit

    s = make_scheduler(audit=audit)
    ts = [Task(lambda t: None, priority=p, resource=r) for p in (CRIT, BG) for r in ("cpu", "io", "inline")]
    s.submit(ts).wait(TIMEOUT)
    assert len(seen) == 6


# **** memory admission ****


def test_memory_is_admitted_before_dispatch_and_released_on_completion(make_scheduler):
    s = make_scheduler(memory=MemoryBudget(100))
    gate = Gate()
    first = Task(gate.body(), memory=mem(60), name="first")
    second = Task(lambda t: "second", memory=mem(60), name="second")
    h1 = s.submit([first])
    assert gate.started.wait(TIMEOUT)
    h2 = s.submit([second], result=second)
    assert second.state is TaskState.READY and s.stats()["memory_waiting"] == 1
    assert s.memory_usage()["total"] == 60
    gate.open()
    assert h2.result(TIMEOUT) == "second"
    h1.wait(TIMEOUT)
    assert s.memory_usage() == {"total": 0, "preparation": 0, "prepared": 0, "execution": 0, "io": 0}


def test_retained_bytes_stay_charged_until_the_owner_releases_the_lease(make_scheduler):
    s = make_scheduler(memory=MemoryBudget(100))
    leases = []

    def publish(t):
        leases.append(t.retain(40))
        return "object"

    p = Task(publish, memory=MemoryEstimate(Domain.PREPARED, output=40, temp=20))
    assert s.submit([p], result=p).result(TIMEOUT) == "object"
    assert s.memory_usage()["prepared"] == 40 and s.memory_usage()["total"] == 40
    big = Task(lambda t: "big", memory=mem(70))
    hb = s.submit([big], result=big)
    assert big.state is TaskState.READY  # blocked by the retained 40
    leases[0].release()
    leases[0].release()  # idempotent
    assert leases[0].released
    assert hb.result(TIMEOUT) == "big"
    assert s.memory_usage()["total"] == 0


def test_retain_more_than_held_is_refused(sched):
    errs = []

    def body(t):
        try:
            t.retain(11)
        except ValueError as e:
            errs.append(e)

    sched.submit([Task(body, memory=mem(10))]).wait(TIMEOUT)
    assert len(errs) == 1


def test_oversized_task_runs_alone_once_nothing_else_holds_memory(make_scheduler):
    peaks: list[int] = []
    budget = MemoryBudget(100, audit=lambda ev, d, n, c, b: peaks.append(b.used()))
    s = make_scheduler(memory=budget)
    gate = Gate()
    small = Task(gate.body(), memory=mem(10), name="small")
    hs = s.submit([small])
    assert gate.started.wait(TIMEOUT)
    huge = Task(lambda t: "huge", memory=mem(150), name="huge")
    after = Task(lambda t: "after", memory=mem(5), name="after")  # same class, queued behind huge: waits
    hh = s.submit([huge, after])
    assert huge.state is TaskState.READY and after.state is TaskState.READY
    gate.open()
    hh.wait(TIMEOUT)
    hs.wait(TIMEOUT)
    assert max(peaks) == 150  # ran alone: nothing else was charged while it held 150


def test_background_cannot_charge_the_critical_reserve(make_scheduler):
    budget = MemoryBudget(100, critical_reserve=30)
    s = make_scheduler(memory=budget, io_workers=4, io_reserved=1)
    gate = Gate()
    bg = [Task(gate.body(), resource=Resource.IO, priority=BG, memory=mem(35), name=f"bg{i}") for i in range(3)]
    hb = s.submit(bg)
    assert gate.started.wait(TIMEOUT)
    assert s.memory_usage()["total"] == 70  # the third (35 more) would dip into the reserve
    crit = Task(lambda t: "ok", memory=mem(30, Domain.EXECUTION), priority=CRIT)
    assert s.submit([crit], result=crit).result(TIMEOUT) == "ok"
    gate.open()
    hb.wait(TIMEOUT)


def test_domain_limit_and_domain_reserve(make_scheduler):
    budget = MemoryBudget(limits={Domain.PREPARATION: 50}, domain_reserve={Domain.PREPARATION: 20})
    s = make_scheduler(memory=budget, io_workers=4, io_reserved=1)
    gate = Gate()
    bg = [Task(gate.body(), resource=Resource.IO, priority=BG, memory=mem(15)) for i in range(3)]
    hb = s.submit(bg)
    assert gate.started.wait(TIMEOUT)
    assert s.memory_usage()["preparation"] == 30  # 45 would exceed 50 - 20 for background work
    crit = Task(lambda t: "ok", memory=mem(20), priority=CRIT)
    assert s.submit([crit], result=crit).result(TIMEOUT) == "ok"
    gate.open()
    hb.wait(TIMEOUT)
    assert s.memory_usage()["preparation"] == 0


def test_memory_blocked_critical_head_is_not_overtaken_by_background(make_scheduler):
    s = make_scheduler(memory=MemoryBudget(100), io_workers=3, io_reserved=1)
    gate = Gate()
    holder = Task(gate.body(), memory=mem(80), resource=Resource.IO, name="holder")
    hh = s.submit([holder])
    assert gate.started.wait(TIMEOUT)
    crit = Task(lambda t: None, memory=mem(50), name="crit")
    small_bg = Task(lambda t: None, memory=mem(10), priority=BG, name="small-bg")
    h = s.submit([crit])
    h2 = s.submit([small_bg])
    # small_bg would fit (80 + 10 <= 100), but the blocked critical head is ahead of it.
    assert crit.state is TaskState.READY and small_bg.state is TaskState.READY
    gate.open()
    h.wait(TIMEOUT)
    h2.wait(TIMEOUT)
    hh.wait(TIMEOUT)


def test_budget_validation():
    with pytest.raises(ValueError):
        MemoryBudget(10, critical_reserve=10)
    with pytest.raises(ValueError):
        MemoryBudget(limits={Domain.IO: 5}, domain_reserve={Domain.IO: 5})
    b = MemoryBudget(100, limits={Domain.IO: 10}, critical_reserve=20)
    assert b.limit(critical=False) == 80 and b.limit(Domain.IO) == 10
    assert b.fits(Domain.IO, 10, False) and b.fits(Domain.EXECUTION, 80, False)
    assert b.fits(Domain.EXECUTION, 1000, True)  # oversized alone: counts as the whole limit
    assert b.oversized(Domain.IO, 11, True) and not b.oversized(Domain.EXECUTION, 80, False)
    b.acquire(Domain.EXECUTION, 1, True)
    assert not b.fits(Domain.EXECUTION, 80, False) and not b.fits(Domain.EXECUTION, 1000, True)
    assert b.fits(Domain.EXECUTION, 99, True) and b.snapshot()["execution"] == 1
    b.release(Domain.EXECUTION, 1)
    from onnx_prepared.errors import InternalError

    with pytest.raises(InternalError):
        b.release(Domain.IO, 1)


# **** dynamic graphs ****


def test_continuation_yields_until_producer_and_resumes_once(sched):
    produced = Task(lambda t: 21, priority=BG, name="prepack")
    seen: list[TaskState] = []

    def continuation(t):
        seen.append(produced.state)
        if produced.state is not TaskState.SUCCEEDED:
            return t.resume_after(produced)  # the producer is submitted through the continuation
        return produced.result * 2

    c = Task(continuation, name="run")
    h = sched.submit([c], result=c)
    assert h.result(TIMEOUT) == 42
    assert c.runs == 2 and seen[-1] is TaskState.SUCCEEDED
    assert produced.priority is CRIT  # inherited from the waiting continuation
    assert produced in h._sub.members


def test_continuation_promotes_a_queued_producer(sched):
    gate = Gate()
    hold = sched.submit([Task(gate.body(), priority=BG)])
    assert gate.started.wait(TIMEOUT)
    producer = Task(lambda t: "w", priority=BG, name="producer")
    hp = sched.submit([producer], fail_fast=False)  # eager preparation, stuck behind the holder
    assert producer.state is TaskState.READY

    def cont(t):
        return t.resume_after(producer) if producer.state is not TaskState.SUCCEEDED else producer.result

    c = Task(cont)
    assert sched.submit([c], result=c).result(TIMEOUT) == "w"
    gate.open()
    hp.wait(TIMEOUT)
    hold.wait(TIMEOUT)


def test_failed_producer_suppresses_the_continuation(sched):
    bad = Task(lambda t: 1 / 0, name="bad")

    def cont(t):
        return t.resume_after(bad)

    c = Task(cont, name="cont")
    h = sched.submit([c])
    with pytest.raises(ZeroDivisionError):
        h.wait(TIMEOUT)
    assert c.state is TaskState.SUPPRESSED and c.cause is bad and c.runs == 1


def test_resume_after_an_already_finished_producer_requeues_immediately(sched):
    p = Task(lambda t: 5)
    sched.submit([p]).wait(TIMEOUT)

    def cont(t):
        return t.resume_after(p) if t.runs == 1 else p.result

    c = Task(cont)
    assert sched.submit([c], result=c).result(TIMEOUT) == 5 and c.runs == 2


def test_add_tasks_to_a_live_submission(sched):
    gate = Gate()
    first = Task(gate.body("first"))
    h = sched.submit([first])
    assert gate.started.wait(TIMEOUT)
    later = Task(lambda t: "later", deps=[first])
    h.add(later)
    gate.open()
    h.wait(TIMEOUT)
    assert later.result == "later"
    with pytest.raises(RuntimeError, match="already SUCCEEDED"):
        h.add(Task(lambda t: 1))


def test_a_later_submission_shares_an_earlier_task(sched):
    runs = []
    w = Task(lambda t: runs.append(1) or "W", resource=Resource.IO, name="read W")
    gate = Gate()
    hold = Task(gate.body(), deps=[w])
    h1 = sched.submit([hold])
    i2 = Task(lambda t: w.result + "2", deps=[w])
    h2 = sched.submit([i2], result=i2)
    assert h2.result(TIMEOUT) == "W2"
    gate.open()
    h1.wait(TIMEOUT)
    assert runs == [1]


def test_when_done_calls_back_once_even_if_already_done(sched):
    calls: list[tuple[str, TaskState]] = []
    gate = Gate()
    t = Task(gate.body())
    h = sched.submit([t])
    sched.when_done(t, lambda x: calls.append(("live", x.state)))
    gate.open()
    h.wait(TIMEOUT)
    sched.when_done(t, lambda x: calls.append(("late", x.state)))
    assert calls == [("live", TaskState.SUCCEEDED), ("late", TaskState.SUCCEEDED)]


def test_when_done_callback_errors_are_logged_not_propagated(sched, caplog):
    t = Task(lambda t: 1)
    sched.when_done(t, lambda x: 1 / 0)
    sched.submit([t]).wait(TIMEOUT)
    assert any("callback" in r.message for r in caplog.records)


# **** CPU executor lease and inline work ****


def test_scheduler_leases_the_session_executor_and_nested_parallel_work_runs_inline():
    cpu = CpuExecutor(2, critical_reserved=1)
    s = RuntimeScheduler(cpu=cpu, io_workers=1, io_reserved=0)
    try:
        threads: list[set[int]] = []

        def body(t):
            seen: set[int] = set()
            cpu.parallel_for(16, lambda i: seen.add(threading.get_ident()))
            threads.append(seen | {threading.get_ident()})

        s.submit([Task(body) for _ in range(4)]).wait(TIMEOUT)
        assert all(len(x) == 1 for x in threads)
        assert {next(iter(x)) for x in threads} <= {th.ident for th in cpu.pool.threads}
    finally:
        s.close()
    assert not cpu.pool.closed  # leased, not owned
    assert cpu.map(lambda x: x, [1, 2]) == [1, 2]
    cpu.close()


def test_inline_tasks_run_on_the_thread_that_made_them_ready(sched):
    where: dict[str, int] = {}
    a = Task(lambda t: where.__setitem__("a", threading.get_ident()), resource=Resource.INLINE)
    b = Task(lambda t: where.__setitem__("b", threading.get_ident()), name="b")
    c = Task(lambda t: where.__setitem__("c", threading.get_ident()), deps=[b], resource=Resource.INLINE)
    sched.submit([a, c]).wait(TIMEOUT)
    assert where["a"] == threading.get_ident()  # ready at submit: ran in submit()
    assert where["c"] == where["b"]  # ready when b finished: ran on b's worker


def test_long_inline_chain_does_not_recurse(sched):
    ts: list[Task] = []
    for i in range(3000):
        ts.append(Task(lambda t, i=i: i, deps=ts[-1:], resource=Resource.INLINE))
    assert sched.submit(ts, result=ts[-1]).result(TIMEOUT) == 2999


def test_close_waits_for_live_submissions_and_refuses_new_ones():
    s = RuntimeScheduler(io_workers=1, io_reserved=0)
    gate = Gate()
    h = s.submit([Task(gate.body("x"))])
    assert gate.started.wait(TIMEOUT)
    closer = threading.Thread(target=s.close)
    closer.start()
    gate.open()
    closer.join(TIMEOUT)
    assert not closer.is_alive() and h.is_ready()
    with pytest.raises(RuntimeError, match="closed"):
        s.submit([Task(lambda t: 1)])
    assert s.cpu.pool.closed  # owned executor is closed


# **** trace ****


def test_trace_exports_chrome_json(make_scheduler, tmp_path):
    s = make_scheduler(trace=True)
    a = Task(lambda t: None, resource=Resource.IO, memory=mem(8), name="read")
    b = Task(lambda t: None, deps=[a], priority=PREF, name="pack")
    s.submit([b]).wait(TIMEOUT)
    doc = json.loads(s.trace.save(tmp_path / "trace.json").read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in xs) == ["pack", "read"]
    read = next(e for e in xs if e["name"] == "read")
    assert read["cat"] == "io" and read["args"]["bytes"] == 8 and read["args"]["priority"] == "critical"
    assert all(isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["dur"] >= 0 and e["ts"] >= 0 for e in xs)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert "-io-" in names[read["tid"]]
    recs = s.trace.records()
    assert all(r.queued <= r.started <= r.finished and r.outcome == "succeeded" for r in recs)


def test_trace_disabled_by_default(sched):
    sched.submit([Task(lambda t: None)]).wait(TIMEOUT)
    assert sched.trace is None
    tr = sched.enable_trace()
    sched.submit([Task(lambda t: None, name="x")]).wait(TIMEOUT)
    assert [r.name for r in tr.records()] == ["x"]


def test_ranked_ready_tasks_take_a_free_slot_in_rank_order_unranked_ones_stay_fifo(sched):
    """S2: the one preparation CPU slot is held (gated) while prefetch tasks become ready in the order
    a3, b1, c2 (ranks 3, 1, 2), then an unranked u, then d0 (rank 0). Released, the slot runs b1, c2, a3
    (rank order), then u, then d0: a ranked task never overtakes an unranked one queued before it."""
    gate = Gate()
    order: list[str] = []
    hold = Task(gate.body(), resource=Resource.CPU, priority=PREF, name="hold")
    h0 = sched.submit(hold)
    assert gate.started.wait(TIMEOUT)

    def task(name: str, rank: int | None) -> Task:
        return Task(lambda t: order.append(name), resource=Resource.CPU, priority=PREF, name=name, rank=rank)

    ts = [task("a3", 3), task("b1", 1), task("c2", 2), task("u", None), task("d0", 0)]
    hs = [sched.submit(t) for t in ts]  # each ready at once, queued behind the held slot
    assert all(t.state is TaskState.READY for t in ts)
    gate.open()
    for h in [h0, *hs]:
        h.wait(TIMEOUT)
    assert order == ["b1", "c2", "a3", "u", "d0"]


def test_a_promoted_ranked_task_keeps_its_rank_in_the_new_class(sched):
    """Promotion (S3) re-queues a ready task in its new class by the same rule: two prefetch tasks ranked
    2 and 1, promoted to critical in that order while both CPU slots are held, run rank 1 first on the
    first slot that frees."""
    g_crit, g_pref = Gate(), Gate()
    h_crit = sched.submit(Task(g_crit.body(), resource=Resource.CPU, priority=CRIT, name="crit"))
    h_pref = sched.submit(Task(g_pref.body(), resource=Resource.CPU, priority=PREF, name="pref"))
    assert g_crit.started.wait(TIMEOUT) and g_pref.started.wait(TIMEOUT)
    order: list[str] = []
    two = Task(lambda t: order.append("r2"), resource=Resource.CPU, priority=PREF, name="r2", rank=2)
    one = Task(lambda t: order.append("r1"), resource=Resource.CPU, priority=PREF, name="r1", rank=1)
    hs = [sched.submit(two), sched.submit(one)]
    sched.promote(two, CRIT)
    sched.promote(one, CRIT)
    g_pref.open()  # one slot frees: critical work may take any slot, so both run there, one at a time
    for h in [h_pref, *hs]:
        h.wait(TIMEOUT)
    g_crit.open()
    h_crit.wait(TIMEOUT)
    assert order == ["r1", "r2"]
