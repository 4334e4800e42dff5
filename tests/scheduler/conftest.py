"""Shared fixtures for scheduler tests: schedulers that always close, and gates the test controls."""

from __future__ import annotations

import threading

import pytest

from onnx_prepared.scheduler import CpuExecutor, MemoryBudget, RuntimeScheduler

#: Generous bound on any wait: a deadlock fails the test instead of hanging it. Never a timing assertion.
TIMEOUT = 30.0


class Gate:
    """A test-held event: task bodies block on it; ``started`` tells the test a body is inside."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.started = threading.Event()
        self.entered = 0
        self._lock = threading.Lock()

    def body(self, value=None):
        def fn(*_task):
            with self._lock:
                self.entered += 1
            self.started.set()
            assert self.opened.wait(TIMEOUT), "gate never opened"
            return value

        return fn

    def open(self) -> None:
        self.opened.set()


@pytest.fixture
def make_scheduler():
    """``make_scheduler(cpu_workers=2, cpu_reserved=1, io_workers=2, io_reserved=1, memory=None, **kw)``."""
    made: list[RuntimeScheduler] = []

    def make(*, cpu_workers: int = 2, cpu_reserved: int = 1, io_workers: int = 2, io_reserved: int = 1,
             memory: MemoryBudget | None = None, **kw) -> RuntimeScheduler:
        s = RuntimeScheduler(cpu=CpuExecutor(cpu_workers, critical_reserved=cpu_reserved), io_workers=io_workers,
                             io_reserved=io_reserved, memory=memory, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close(cancel=True)
        s.cpu.close()


@pytest.fixture
def sched(make_scheduler):
    return make_scheduler()
