"""WorkerPool: persistent worker threads, a FIFO job queue, and an orderly shutdown that joins them all.

This is the layer the spec extracts below both the runtime scheduler and batch users: it knows nothing
about dependencies, priorities or cancellation. Jobs are expected to handle their own errors; a job
that raises anyway is logged and recorded, and :meth:`WorkerPool.close` reports it as an
:class:`~onnx_prepared.errors.InternalError` (it is a bug in the job, not user input).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from onnx_prepared.errors import InternalError

_tls = threading.local()


def _log():
    """The scheduler's logger; ``logging`` loads on the first message (a bug's), not at start-up."""
    import logging

    return logging.getLogger("onnx_prepared.scheduler")


def current_pool() -> WorkerPool | None:
    """The pool whose worker is running the calling thread, or None."""
    return getattr(_tls, "pool", None)


class WorkerPool:
    """``workers`` persistent threads running submitted jobs in FIFO order.

    >>> pool = WorkerPool(2, name="io")
    >>> pool.submit(print, "hello")
    >>> pool.close()  # runs every job already submitted, then joins every thread

    :meth:`submit` and :meth:`close` are thread-safe.
    """

    def __init__(self, workers: int, *, name: str = "onnx-prepared"):
        if workers < 1:
            raise ValueError(f"a WorkerPool needs at least one worker, got {workers}")
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders submit() against close(): no job lands after the sentinels
        self._closed = False
        self._errors: list[BaseException] = []
        self._threads = tuple(
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        )
        for t in self._threads:
            t.start()

    @property
    def size(self) -> int:
        return len(self._threads)

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return self._threads

    @property
    def closed(self) -> bool:
        return self._closed

    def owns_current_thread(self) -> bool:
        return getattr(_tls, "pool", None) is self

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Enqueue ``fn(*args)``; raises RuntimeError once :meth:`close` has started."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"WorkerPool {self.name!r} is closed")
            self._jobs.put((fn, args))

    def close(self) -> None:
        """Stop accepting jobs, run the ones already queued, and join every thread (idempotent)."""
        if self.owns_current_thread():
            raise RuntimeError(f"WorkerPool {self.name!r} cannot be closed from one of its own workers")
        with self._lock:
            first = not self._closed
            self._closed = True
            if first:
                for _ in self._threads:
                    self._jobs.put(None)
        for t in self._threads:
            t.join()
        if first and self._errors:
            raise InternalError(f"{len(self._errors)} job(s) raised in WorkerPool {self.name!r}") from self._errors[0]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _work(self) -> None:
        _tls.pool = self
        get = self._jobs.get
        while True:
            job = get()
            if job is None:
                return
            try:
                job[0](*job[1])
            except BaseException as e:  # a job's own bug: keep the worker alive, report at close()
                self._errors.append(e)
                _log().exception("job raised in WorkerPool %r", self.name)
            del job  # drop references to the job's arguments before blocking again

    def __repr__(self) -> str:
        return f"<WorkerPool {self.name!r} workers={self.size} {'closed' if self._closed else 'open'}>"
