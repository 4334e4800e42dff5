"""The usage the prepared session will build on, as a runnable example: eager preparation (read -> prepack per
weight, prepared bytes handed to the store by a lease) and inference as one continuation that yields on a
missing weight, promoting its producer chain, while background preparation continues."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from onnx_prepared.errors import Cancelled
from onnx_prepared.scheduler import (
    CpuExecutor,
    Domain,
    HandleState,
    MemoryBudget,
    MemoryEstimate,
    MemoryLease,
    Priority,
    Resource,
    RuntimeScheduler,
    Task,
    TaskState,
)

from .conftest import TIMEOUT


class Store:
    """A toy PreparedObjectStore: key -> (producer task, packed array, lease)."""

    def __init__(self, sched: RuntimeScheduler, weights: list[np.ndarray]):
        self.sched = sched
        self.weights = weights
        self.lock = threading.Lock()
        self.producer: dict[int, Task] = {}
        self.packed: dict[int, np.ndarray] = {}
        self.leases: dict[int, MemoryLease] = {}

    def producer_of(self, i: int, priority: Priority = Priority.BACKGROUND) -> Task:
        """The (shared) prepack task of weight ``i``: one generation per key, reused by every consumer."""
        with self.lock:
            if i not in self.producer:
                w = self.weights[i]
                read = Task(lambda t: w.copy(), resource=Resource.IO, priority=priority,
                            memory=MemoryEstimate(Domain.PREPARATION, output=w.nbytes), name=f"read W{i}")

                def prepack(t: Task, i: int = i) -> np.ndarray:
                    packed = np.ascontiguousarray(read.result.T)
                    with self.lock:
                        self.packed[i] = packed
                        self.leases[i] = t.retain(packed.nbytes)  # stays charged to PREPARED until evicted
                    return packed

                self.producer[i] = Task(prepack, deps=[read], priority=priority, name=f"prepack W{i}",
                                        memory=MemoryEstimate(Domain.PREPARED, input=w.nbytes, output=w.nbytes))
            return self.producer[i]

    def resident(self, i: int) -> np.ndarray | None:
        with self.lock:
            return self.packed.get(i)

    def evict_all(self) -> None:
        with self.lock:
            for lease in self.leases.values():
                lease.release()
            self.leases.clear()


def run_async(sched: RuntimeScheduler, store: Store, x: np.ndarray):
    """Sequential inference as one continuation: replay layers; on a missing weight, yield to its producer."""
    state = {"pc": 0, "h": x}

    def continuation(t: Task):
        while state["pc"] < len(store.weights):
            packed = store.resident(state["pc"])
            if packed is None:
                return t.resume_after(store.producer_of(state["pc"]))  # inherits critical priority
            t.token.check()
            state["h"] = np.maximum(state["h"] @ packed.T, 0)
            state["pc"] += 1
        return state["h"]

    run = Task(continuation, priority=Priority.CRITICAL, name="run")
    return sched.submit([run], result=run, keepalive=x), run


@pytest.fixture
def session():
    cpu = CpuExecutor(2, critical_reserved=1)
    budget = MemoryBudget(1 << 20, limits={Domain.PREPARATION: 1 << 18}, critical_reserve=1 << 16)
    sched = RuntimeScheduler(cpu=cpu, io_workers=2, io_reserved=1, memory=budget, trace=True)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(6)]
    yield sched, Store(sched, weights)
    sched.close(cancel=True)
    cpu.close()


def reference(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    for w in weights:
        x = np.maximum(x @ w, 0)
    return x


def test_cold_inference_overlaps_eager_preparation(session):
    sched, store = session
    prepare = sched.submit([store.producer_of(i) for i in range(len(store.weights))], fail_fast=False)
    x = np.ones((2, 8), np.float32)
    h, run = run_async(sched, store, x)
    np.testing.assert_allclose(h.result(TIMEOUT), reference(store.weights, x), rtol=1e-5)
    prepare.wait(TIMEOUT)
    assert run.runs >= 1 and h.status is HandleState.SUCCEEDED
    assert sched.memory_usage()["prepared"] == sum(w.nbytes for w in store.weights)  # held by the store's leases
    # Hot path: everything resident, the continuation never yields.
    h2, run2 = run_async(sched, store, x)
    np.testing.assert_allclose(h2.result(TIMEOUT), reference(store.weights, x), rtol=1e-5)
    assert run2.runs == 1
    store.evict_all()
    assert sched.memory_usage()["total"] == 0
    names = {e["name"] for e in sched.trace.to_chrome()["traceEvents"] if e["ph"] == "X"}
    assert {"run", "read W0", "prepack W5"} <= names


def test_demand_only_inference_and_cancel_keeps_weights_another_run_needs(session):
    sched, store = session
    x = np.ones((1, 8), np.float32)
    h1, _ = run_async(sched, store, x)  # no eager preparation: each run pulls the producers it needs
    h2, _ = run_async(sched, store, x)
    h1.cancel()
    np.testing.assert_allclose(h2.result(TIMEOUT), reference(store.weights, x), rtol=1e-5)
    try:
        h1.wait(TIMEOUT)
    except Cancelled:
        assert h1.status is HandleState.CANCELLED
    assert all(store.producer_of(i).state is TaskState.SUCCEEDED for i in range(len(store.weights)))
