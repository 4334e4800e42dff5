"""RuntimeSession: prepare_async / run_async / close over the parts one construction built.

:func:`~onnx_prepared.runtime.builder.build_session` loads the model metadata-only, resolves it, builds
the one :class:`PreparedExecutionPlan` and the mutable :class:`PreparedExecutionState`; the session
holds those parts. Both entry points return the scheduler's :class:`ExecutionHandle`:

* ``prepare_async()`` submits every session task (read -> prepack -> publish) eagerly;
* ``run_async(feeds)`` never blocks and never waits for preparation; :mod:`~onnx_prepared.runtime.inference`
  runs it on the cold path (a continuation that yields until the prepared objects it reads are
  published) or, when everything is resident, on the hot path (one lease, a direct replay).

``prepare()`` is ``prepare_async().wait()`` and ``run(feeds)`` is ``run_async(feeds).result()``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from onnx_prepared.errors import ClosedError
from onnx_prepared.kernels import threads
from onnx_prepared.model import ExternalDataReader, LoadedModel
from onnx_prepared.runtime.builder import SessionParts, build_session, default_scheduler
from onnx_prepared.runtime.context import RuntimeContext
from onnx_prepared.runtime.inference import Inference
from onnx_prepared.runtime.producers import REFUSED
from onnx_prepared.scheduler import ExecutionHandle, RuntimeScheduler

__all__ = ["RuntimeSession", "default_scheduler"]


class RuntimeSession:
    """A prepared-execution session over one model.

    >>> sess = RuntimeSession("tiny-llm.onnx")
    >>> h = sess.run_async({"x": x})     # returns at once; runs while weights still load
    >>> (y,) = h.result()

    Construction is :func:`~onnx_prepared.runtime.builder.build_session` (load -> resolve -> plan ->
    state); :meth:`from_parts` adopts parts built elsewhere.
    """

    def __init__(
        self,
        model: str | os.PathLike | LoadedModel,
        options: Any = None,
        *,
        scheduler: RuntimeScheduler | None = None,
        reader: ExternalDataReader | None = None,
    ) -> None:
        self._adopt(build_session(model, options, scheduler=scheduler, reader=reader))

    @classmethod
    def from_parts(cls, parts: SessionParts) -> RuntimeSession:
        """A session over parts from :func:`~onnx_prepared.runtime.builder.build_session`; it owns them."""
        self = cls.__new__(cls)
        self._adopt(parts)
        return self

    def _adopt(self, parts: SessionParts) -> None:
        self.parts = parts
        self.options = parts.options
        self.resolved = parts.resolved
        self.plan = parts.plan
        self.arenas = parts.arenas
        self.state = parts.state
        self.store = parts.state.store  # the in-memory prepared-object store (generation records)
        self.companion = parts.companion  # the companion-model cache on disk (PreparedModelStore), or None
        self.scheduler = parts.scheduler
        self.producers = parts.producers
        self._feeds = parts.feeds
        self.inference = Inference(parts.plan, parts.state, parts.producers, parts.scheduler,
                                   intra_op_threads=threads.resolve(parts.options.intra_op_num_threads),
                                   blas_threads=parts.options.blas_threads)
        self._closed = False

    def trace_actions(self, after):
        """``with sess.trace_actions(fn):`` runs submitted inside call ``fn(action_index)`` after each
        action's kernel (tests, benchmarks); see :meth:`Inference.trace_actions`."""
        return self.inference.trace_actions(after)

    @property
    def counters(self):
        """``hot_runs``, ``cold_runs``, ``yields`` of this session's runs."""
        return self.inference.counters

    @property
    def intra_op_threads(self) -> int:
        return self.inference.intra_op_threads

    @property
    def need_order(self) -> tuple[int, ...]:
        return self.plan.need_order

    # ---- public API ----
    def prepare_async(self) -> ExecutionHandle:
        """Submit every session task not already resident (read -> prepack -> publish), eagerly, in need
        order with row tables last (``Inference.prepare_order``).

        Under a residency budget only what fits is prepared (the rest is restored on demand).
        """
        self._check_open("prepare")
        tasks = []
        # Every chain is created before any starts, so a source shared by two layouts is attached to both
        # before its read can finish: read once.
        chains: list = []
        for b, priority in self.inference.prepare_order():
            t = self.producers.ensure(self.plan.requirements[b].key, priority, defer=chains)
            if t is REFUSED:
                break
            if t is not None:
                tasks.append(t)
        self.producers.start(chains)
        # fail_fast=False: one bad object fails only its consumers, not the rest of preparation. Kept by
        # the producers: close() cancels it as it cancels their own submissions (a live one would keep
        # every task it holds wanted on the shared scheduler).
        handle = self.scheduler.submit(tasks, fail_fast=False)
        self.producers.keep(handle)
        return handle

    def prepare(self, *, sequential: bool = False, progress: Any = None) -> None:
        """Prepare every object before returning (``prepare_async().wait()``), and flush the cache.

        ``sequential=True`` is the spec's reference path: exactly the same session tasks, run one at a
        time in plan order on the calling thread (benchmarks compare it with the parallel schedule).
        ``progress`` (default: ``SessionOptions.progress``): True for a tqdm bar on a terminal, or
        ``fn(done, total)`` called with the number of resident prepared objects; None is silent.
        """
        from onnx_prepared.progress import reporter

        report = reporter(self.options.progress if progress is None else progress, len(self.plan.requirements),
                          "prepare")
        if sequential:
            self.state.prepare_sequential([self.plan.requirements[b] for b in self.plan.need_order])
        elif report is None:
            self.prepare_async().wait()
        else:
            self.wait_reporting(self.prepare_async(), report)
        self.state.reader.reader.check_verified()  # nothing prepared from bytes that failed their checksum
        self.producers.flush()
        if report is not None:
            report(len(self.plan.requirements), len(self.plan.requirements))

    def wait_reporting(self, handle: ExecutionHandle, report: Any, interval: float = 0.1) -> None:
        """``handle.wait()``, calling ``report(resident prepared objects, total)`` every ``interval`` s."""
        from onnx_prepared.prepared.store import EntryState

        total = len(self.plan.requirements)
        while True:
            try:
                handle.wait(timeout=interval)  # re-raises a failure
                return
            except TimeoutError:
                report(sum(s is EntryState.RESIDENT for s in self.store.states().values()), total)

    def flush_cache(self) -> int:
        """Write every pending companion-cache entry now; returns how many were written."""
        return self.producers.flush()

    def run_async(self, feeds: Mapping[str, Any], context: RuntimeContext | None = None) -> ExecutionHandle:
        """Submit one inference; returns at once. ``handle.result()`` is the list of outputs.

        ``context`` carries caller-owned mutable bindings (a KV cache, :class:`RuntimeContext`): its
        bindings are fed too, and a successful run rebinds its carried inputs to the outputs. It belongs
        to this submission until it is terminal.
        """
        return self._submit(feeds, context, inline=False)

    def run(self, feeds: Mapping[str, Any], context: RuntimeContext | None = None) -> list:
        """``run_async(feeds, context).result()`` (a hot run executes on this thread, inline, without a handle)."""
        self._check_open("run")
        values, overridden = self._feeds.bind(feeds if context is None else context.feeds(feeds))
        return self.inference.run(values, overridden, context)

    def _submit(self, feeds: Mapping[str, Any], context: RuntimeContext | None, *, inline: bool) -> ExecutionHandle:
        self._check_open("run")
        values, overridden = self._feeds.bind(feeds if context is None else context.feeds(feeds))
        return self.inference.submit(values, overridden, context, inline=inline)

    def _check_open(self, what: str) -> None:
        # One error whatever the scheduler: an own scheduler is closed with the session, the shared
        # default one is not, and a run must not depend on which (ClosedError, not RuntimeError).
        if self._closed:
            raise ClosedError(f"{what}() on a closed RuntimeSession: create a new session")

    def close(self) -> None:
        """Wait for the runs submitted, flush the companion cache (when persisting), cancel the session's
        own preparation and release its resources: nothing of the session runs after this returns,
        on the shared default scheduler as on one the session owns (docs/async.md)."""
        if self._closed:
            return
        self._closed = True  # no new run or preparation (_check_open)
        self.inference.wait_runs()  # a live run's bound reads and prepacks are not cancelled under it
        if self.producers.persisting:
            # NOTE: a cache that cannot be written is a miss next time, not an error
            with contextlib.suppress(Exception):
                self.producers.flush()
        self.producers.close()  # its session tasks, on a shared scheduler too
        if self.parts.read_ahead is not None:  # its threads end after their current piece
            self.parts.read_ahead.stop()
            self.parts.read_ahead.join(1.0)
        if self.parts.owns_scheduler:  # with the CPU executor built for it, which it only leases
            self.scheduler.close(cancel=True)
            self.scheduler.cpu.close()
        self.state.reader.close()
        if self.companion is not None:  # the companion store this session opened (its data fds)
            self.companion.close()

    def __enter__(self) -> RuntimeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
