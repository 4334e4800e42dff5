"""Stress: a 10,000-task graph, and 100 concurrent submissions sharing session tasks with random cancels."""

from __future__ import annotations

import random
import threading

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


def test_ten_thousand_task_graph():
    rng = random.Random(1234)
    budget = MemoryBudget(1000, limits={Domain.PREPARATION: 600}, critical_reserve=100)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=3, io_reserved=1,
                             devices={"d0": 1}, memory=budget, name="stress")
    violations: list[str] = []
    tasks: list[Task] = []
    n = 10_000

    def body(t: Task):
        total = 0
        for d in t.dependencies:
            if d.state is not TaskState.SUCCEEDED:
                violations.append(t.name)
            total += d.result
        return total + 1

    try:
        for i in range(n):
            lo = max(0, i - 50)
            deps = [tasks[j] for j in rng.sample(range(lo, i), min(i - lo, rng.randint(0, 3)))]
            tasks.append(Task(body, deps=deps, resource=rng.choice(["cpu", "cpu", "io", "inline", "device:d0"]),
                              priority=rng.choice(list(Priority)), name=f"t{i}",
                              memory=MemoryEstimate(Domain.PREPARATION, output=rng.choice([0, 0, 10, 50]))))
        h = sched.submit(tasks)
        h.wait(TIMEOUT)
    finally:
        sched.close(cancel=True)
    assert violations == []
    assert all(t.state is TaskState.SUCCEEDED for t in tasks)
    # Results are path counts + 1: recompute them sequentially to prove every edge was honoured.
    expect: list[int] = []
    index = {t: i for i, t in enumerate(tasks)}
    for t in tasks:
        expect.append(sum(expect[index[d]] for d in t.dependencies) + 1)
    assert [t.result for t in tasks] == expect


def test_hundred_concurrent_submissions_with_random_cancels():
    rng = random.Random(99)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=3, io_reserved=1,
                             memory=MemoryBudget(10_000, critical_reserve=1000), name="concurrent")
    # Session tasks: read (io) -> prepack (cpu) per weight, shared by every inference; eager prep wants all.
    reads = [Task(lambda t, w=w: w, resource=Resource.IO, priority=Priority.PREFETCH, name=f"read W{w}",
                  memory=MemoryEstimate(Domain.PREPARATION, output=100)) for w in range(40)]
    packs = [Task(lambda t, r=r: r.result * 2, deps=[r], priority=Priority.BACKGROUND, name=f"pack W{i}",
                  memory=MemoryEstimate(Domain.PREPARED, output=100, temp=50)) for i, r in enumerate(reads)]
    prep = sched.submit(packs[:20], fail_fast=False)  # eager preparation of half the weights
    handles: list = [None] * 100
    wanted: list[set[int]] = [set() for _ in range(100)]
    expected: list[int] = [0] * 100
    ready = threading.Semaphore(0)

    def submitter(ids: list[int], seed: int) -> None:
        r = random.Random(seed)
        for k in ids:
            ws = r.sample(range(40), 4)
            wanted[k] = set(ws)
            chain: list[Task] = []
            for j, w in enumerate(ws):
                chain.append(Task(lambda t, p=packs[w], prev=chain[-1:]: p.result + (prev[0].result if prev else 0),
                                  deps=[packs[w], *chain[-1:]], name=f"I{j}@run-{k}",
                                  memory=MemoryEstimate(Domain.EXECUTION, output=10)))
            expected[k] = sum(2 * w for w in ws)
            handles[k] = sched.submit(chain, result=chain[-1])
            ready.release()

    threads = [threading.Thread(target=submitter, args=(list(range(i, 100, 4)), i)) for i in range(4)]
    cancelled: set[int] = set()

    def canceller() -> None:
        for _ in range(100):
            assert ready.acquire(timeout=TIMEOUT)
            k = rng.randrange(100)
            if handles[k] is not None and rng.random() < 0.6:
                handles[k].cancel()
                cancelled.add(k)

    cthread = threading.Thread(target=canceller)
    for t in [*threads, cthread]:
        t.start()
    for t in [*threads, cthread]:
        t.join(TIMEOUT)
        assert not t.is_alive()
    try:
        for k, h in enumerate(handles):
            try:
                assert h.result(TIMEOUT) == expected[k]
                assert h.status is HandleState.SUCCEEDED
            except Cancelled:
                assert k in cancelled and h.status is HandleState.CANCELLED
        prep.wait(TIMEOUT)
    finally:
        sched.close()
    # A shared task some live submission still wanted was never cancelled by another's cancel.
    for k in set(range(100)) - cancelled:
        assert all(packs[w].state is TaskState.SUCCEEDED for w in wanted[k])
    assert all(p.state is TaskState.SUCCEEDED for p in packs[:20])
    st = sched.stats()
    assert st["memory"]["total"] == 0 and st["live_submissions"] == 0
    assert len(cancelled) > 10
