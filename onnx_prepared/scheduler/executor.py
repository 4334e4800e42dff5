"""CpuExecutor: the session's one CPU worker pool, split into latency-critical and preparation slots.

The runtime scheduler leases it instead of creating a second CPU pool. Kernel parallel regions go through
:meth:`CpuExecutor.parallel_for` / :meth:`CpuExecutor.map`: called from one of the executor's own workers
(a CPU task already holds a participant) they run inline, so nested parallelism never wakes unrelated
workers or waits for a slot it is itself occupying.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from onnx_prepared.errors import InvalidOptionError
from onnx_prepared.scheduler.task import CancelToken
from onnx_prepared.scheduler.workers import WorkerPool, current_pool

T = TypeVar("T")
R = TypeVar("R")


class CpuExecutor:
    """``workers`` CPU participants; ``critical_reserved`` of them are kept for critical (inference) work.

    Preparation (prefetch/background) tasks may occupy at most ``workers - critical_reserved`` slots.
    The default on a 2-core machine is 2 workers with 1 reserved: preparation uses the other one.

    :meth:`parallel_for` and :meth:`map` are thread-safe (several callers may share the pool).

    >>> cpu = CpuExecutor(2, critical_reserved=1)
    >>> cpu.map(lambda x: x * x, range(4))
    [0, 1, 4, 9]
    """

    def __init__(self, workers: int | None = None, *, critical_reserved: int = 1, name: str = "onnx-prepared-cpu"):
        n = workers if workers is not None else max(2, os.cpu_count() or 1)
        if n < 1 or not 0 <= critical_reserved < n:
            raise InvalidOptionError("cpu_workers", n, f"an int >= 1 with 0 <= critical_reserved ({critical_reserved}) "
                                                       f"< workers")
        self.workers = n
        self.critical_reserved = critical_reserved
        self.pool = WorkerPool(n, name=name)

    @property
    def preparation_slots(self) -> int:
        return self.workers - self.critical_reserved

    def in_worker(self) -> bool:
        """True on one of this executor's threads (nested parallel work then runs inline)."""
        return current_pool() is self.pool

    def parallel_for(self, n: int, fn: Callable[[int], Any], *, token: CancelToken | None = None) -> None:
        """Call ``fn(i)`` for ``i in range(n)``; inline on a worker, else spread over the pool.

        The caller participates, so this completes even when every worker is busy. The first error
        is re-raised after every started call returned; ``token`` stops handing out new indices.
        """
        if n <= 0:
            return
        if n == 1 or self.in_worker():
            for i in range(n):
                if token is not None:
                    token.check()
                fn(i)
            return
        job = _ParallelFor(n, fn, token)
        for _ in range(min(self.workers, n - 1)):
            self.pool.submit(job.run)
        job.run()
        job.join()
        if job.error is not None:
            raise job.error
        if token is not None:
            token.check()

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, token: CancelToken | None = None) -> list[R]:
        """``[fn(x) for x in items]`` through :meth:`parallel_for` (same inline rule)."""
        xs = list(items)
        out: list[Any] = [None] * len(xs)

        def one(i: int) -> None:
            out[i] = fn(xs[i])

        self.parallel_for(len(xs), one, token=token)
        return out

    def close(self) -> None:
        """Join every worker (idempotent)."""
        self.pool.close()

    def __enter__(self) -> CpuExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CpuExecutor workers={self.workers} critical_reserved={self.critical_reserved}>"


class _ParallelFor:
    """Indices handed out one at a time under a lock; ``join`` waits for every claimed index."""

    __slots__ = ("claimed", "cond", "error", "finished", "fn", "n", "token")

    def __init__(self, n: int, fn: Callable[[int], Any], token: CancelToken | None):
        self.n = n
        self.fn = fn
        self.token = token
        self.cond = threading.Condition(threading.Lock())
        self.claimed = 0  # invariant: finished <= claimed <= n
        self.finished = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        cond, fn, token = self.cond, self.fn, self.token
        while True:
            with cond:
                if self.claimed >= self.n or self.error is not None or (token is not None and token.cancelled):
                    return
                i = self.claimed
                self.claimed += 1
            try:
                fn(i)
            except BaseException as e:
                with cond:
                    if self.error is None:
                        self.error = e
            finally:
                with cond:
                    self.finished += 1
                    if self.finished == self.claimed:
                        cond.notify_all()

    def join(self) -> None:
        with self.cond:
            while self.finished < self.claimed:
                self.cond.wait()
