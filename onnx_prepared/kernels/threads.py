"""Intra-op threads: how many threads one kernel call may use right now (native pool, BLAS).

The policy, decided here and nowhere else:

* A run's budget is its session's ``intra_op_num_threads`` (onnxruntime's name; 0 = every CPU this
  process may run on, :func:`machine_threads`). The run's thread binds it with :func:`bind` before the
  first action; a kernel called outside a run (tests, benchmarks) gets :func:`machine_threads`.
* While preparation tasks (read/prepack at prefetch or background priority) hold CPU slots of the run's
  scheduler, a kernel gets the budget minus those slots, at least 1 (:func:`available`). The cold path's
  first inference and the preparation beside it therefore never ask for more threads than there are
  cores; once preparation is done (hot path) a kernel gets the whole budget.
* The native extension's pool (:mod:`onnx_prepared.kernels.native`) runs every native kernel with
  :func:`available` threads; :func:`bind` resizes it only when that count changes (its resize waits for
  a call in flight, so it is never done per kernel call).
* BLAS does not follow: OpenBLAS's results depend on its thread count (measured on tiny-llm: logits of
  a 1-thread and a 2-thread run differ by up to 5e-7), and a session's runs must be bit-identical
  whether preparation is in flight or not. Its count is process-wide (``openblas_set_num_threads_local``
  too: measured, the value one thread sets is what the next thread's call returns as the previous one),
  so it stays fixed: ``SessionOptions.blas_threads``, default 1. :func:`bind` sets it only when it
  differs from the current value, so it is set once, not flipped per run.

Kernels read :func:`available` per call (a thread-local lookup and one integer read, well under a
microsecond); results never depend on it: every kernel that uses it splits over output rows/columns only.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Protocol

from onnx_prepared.kernels import _blas

_local = threading.local()


class PreparationGauge(Protocol):
    """What a run's scheduler reports: CPU slots preparation tasks hold now (a hint, read without a lock)."""

    def cpu_preparation_running(self) -> int: ...


@functools.cache
def machine_threads() -> int:
    """CPUs this process may run on (its affinity mask at first use, where the OS has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve(intra_op_num_threads: int | None) -> int:
    """A session's budget from ``SessionOptions.intra_op_num_threads`` (0 or None: every core)."""
    n = int(intra_op_num_threads or 0)
    if n < 0:
        raise ValueError(f"intra_op_num_threads must be >= 0 (0: one per core), got {n}")
    return n or machine_threads()


#: OpenBLAS threads when the session does not fix them (see the module docstring)
DEFAULT_BLAS_THREADS = 1


def bind(budget: int, gauge: PreparationGauge | None = None, *, blas: int | None = None) -> None:
    """Bind a run's budget (and its scheduler's preparation gauge) to this thread; every run calls it.

    ``blas`` is ``SessionOptions.blas_threads`` (None: :data:`DEFAULT_BLAS_THREADS`). The common case,
    nothing changed since this thread's last run, is one tuple comparison against this thread's binding
    and the process-wide BLAS count and native pool size. It cannot be done once per thread: BLAS's
    count and the pool's size are process-wide (a run of another session, with another
    ``blas_threads`` or budget, may have changed them on another thread), and the pool's size follows
    the preparation gauge, which differs from one run of this thread to the next (the cold run beside
    preparation, the hot runs after it). Otherwise OpenBLAS is called only when its count differs, and
    the pool resized only when its size does.
    """
    if blas is None:
        blas = DEFAULT_BLAS_THREADS
    n = _available(budget, gauge)
    if n == _native_threads and blas == _blas._current and _local.__dict__.get("bound") == (budget, gauge):
        return
    _local.budget = budget
    _local.gauge = gauge
    _local.bound = (budget, gauge)
    _blas.set_threads(blas)
    _sync_native(n)


_native_threads: int | None = None  # the count last given to the native pool (None: not yet)


def _sync_native(n: int) -> None:
    global _native_threads
    if n == _native_threads:
        return
    native = _native()
    if native is not None:
        native.set_num_threads(n)
    _native_threads = n


@functools.cache
def _native():
    """The native extension's module when it is built and enabled, else None (imported on first use)."""
    try:
        from onnx_prepared.kernels import native
    except ImportError:
        return None
    return native if native.available() else None


def available() -> int:
    """Threads one kernel call may use now, the calling thread included (>= 1)."""
    budget = getattr(_local, "budget", None)
    if budget is None:
        return machine_threads()
    return _available(budget, _local.gauge)


def _available(budget: int, gauge: PreparationGauge | None) -> int:
    return budget if gauge is None else max(1, budget - gauge.cpu_preparation_running())
