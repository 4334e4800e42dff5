"""ExecutionHandle: the one handle type every submission returns (RuntimeSession.prepare_async / run_async too).

The handle owns a :class:`_Submission`, the scheduler's per-submission state. The scheduler references the
submission, never the handle, so dropping the last reference to a live handle runs ``__del__``, which
waits for the submission (the spec's documented choice: tasks may still use caller-owned inputs).
"""

from __future__ import annotations

import builtins
import contextlib
import sys
import threading
from collections.abc import Callable, Generator, Iterable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from onnx_prepared import errors
from onnx_prepared.errors import InternalError
from onnx_prepared.records import record
from onnx_prepared.scheduler.task import Task
from onnx_prepared.scheduler.workers import _log, current_pool

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

_future_lock = threading.Lock()  # creates a handle's future once (rare: only callers that ask for one)


class HandleState(IntEnum):
    RUNNING = 0
    CANCELLING = 1  # cancel() was called; started tasks are being joined
    SUCCEEDED = 2
    FAILED = 3
    CANCELLED = 4

    def __str__(self) -> str:
        return self.name


H = HandleState
_ALLOWED: dict[HandleState, frozenset[HandleState]] = {
    H.RUNNING: frozenset({H.CANCELLING, H.SUCCEEDED, H.FAILED, H.CANCELLED}),
    H.CANCELLING: frozenset({H.SUCCEEDED, H.FAILED, H.CANCELLED}),
    H.SUCCEEDED: frozenset(),
    H.FAILED: frozenset(),
    H.CANCELLED: frozenset(),
}
_DONE = frozenset({H.SUCCEEDED, H.FAILED, H.CANCELLED})


@record(frozen=True, slots=True)
class Diagnostics:
    """What happened to one submission (a snapshot; complete once the handle is done)."""

    status: HandleState
    failed: tuple[Task, ...]  # tasks whose body raised, in the order this submission observed them
    errors: tuple[BaseException, ...]  # their exceptions, same order; wait() raises errors[0]
    suppressed: tuple[tuple[Task, Task], ...]  # (never-run task, the failed task that caused it)
    cancelled: tuple[Task, ...]  # tasks of this submission that ended CANCELLED
    released: tuple[Task, ...]  # shared tasks this submission stopped waiting for when it was cancelled

    @property
    def failing_task(self) -> Task | None:
        return self.failed[0] if self.failed else None

    def exception_group(self) -> BaseException | None:
        """Every failure as one ``BaseExceptionGroup`` (Python 3.11+), or None when nothing failed."""
        if not self.errors:
            return None
        group = getattr(builtins, "BaseExceptionGroup", None)
        if group is None:  # Python 3.10: no exception groups; the first error stands for all
            return self.errors[0]
        names = ", ".join(t.name for t in self.failed)
        return group(f"{len(self.errors)} task(s) failed: {names}", list(self.errors))


class _Latch:
    """A one-shot event on a single lock (``threading.Event`` builds a Condition per submission).

    The lock is held from creation until :meth:`set`; waiters acquire and release it in turn.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Open the latch (called once, by the scheduler)."""
        if not self._set:
            self._set = True
            self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        ok = self._lock.acquire() if timeout is None else self._lock.acquire(timeout=max(0.0, timeout))
        if ok:
            self._lock.release()
        return ok or self._set


class _Submission:
    """Mutable state of one submission; guarded by the scheduler lock (``done`` and results excepted)."""

    __slots__ = (
        "attaching",
        "callbacks",
        "cancel_requested",
        "diagnostics",
        "done",
        "errors",
        "fail_fast",
        "failed",
        "keepalive",
        "members",
        "n_cancelled",
        "pending",
        "released",
        "result_lock",
        "result_memo",
        "result_spec",
        "scheduler",
        "state",
    )

    def __init__(self, scheduler: Any, *, fail_fast: bool, result: Any, keepalive: Any):  # a RuntimeScheduler
        self.scheduler = scheduler
        self.state = H.RUNNING  # written only by _transition
        self.members: dict[Task, None] = {}  # every task it wanted (closure), dependencies first
        self.pending = 0  # members not terminal and not released; 0 -> the submission completes
        self.attaching = False  # completion is deferred while tasks are being attached
        self.fail_fast = fail_fast
        self.cancel_requested = False
        self.failed: list[Task] = []
        self.errors: list[BaseException] = []
        self.n_cancelled = 0
        self.released: list[Task] = []
        self.diagnostics: Diagnostics | None = None  # frozen at the terminal state
        self.done = _Latch()
        self.callbacks: list[Callable[[], Any]] = []
        self.result_spec = result
        self.result_lock = threading.Lock() if callable(result) and not isinstance(result, Task) else None
        self.result_memo: tuple[bool, Any] | None = None
        self.keepalive = keepalive

    def _transition(self, new: HandleState) -> None:
        if new not in _ALLOWED[self.state]:
            raise InternalError(f"illegal submission transition {self.state.name} -> {new.name}")
        self.state = new


class ExecutionHandle:
    """Completion, result, cancellation and diagnostics of one submission.

    >>> h = scheduler.submit([read, pack], result=pack)
    >>> h.result(timeout=10)          # waits; re-raises the first failure
    >>> await h                       # from asyncio, without blocking the event loop
    >>> with scheduler.submit(tasks) as h: ...   # exit waits; an exception in the block cancels first
    >>> concurrent.futures.wait([h.future, ...]); asyncio.wrap_future(h.future)

    It follows ``concurrent.futures.Future`` (``done``, ``cancelled``, ``result``, ``exception``,
    ``add_done_callback``, ``cancel``). Semantics (cancellation, failure, destruction, the waiter
    boundary) are stated once in ``onnx_prepared.scheduler``. Every method is thread-safe.
    """

    __slots__ = ("__weakref__", "_future", "_sub")

    def __init__(self, sub: _Submission):
        self._sub = sub
        self._future: concurrent.futures.Future | None = None

    # **** completion ****

    @property
    def status(self) -> HandleState:
        return self._sub.state

    def is_ready(self) -> bool:
        """True once the submission reached its terminal state (never blocks)."""
        return self._sub.done.is_set()

    def done(self) -> bool:
        """``Future.done()``: the submission is terminal (succeeded, failed or cancelled)."""
        return self._sub.done.is_set()

    def cancelled(self) -> bool:
        """``Future.cancelled()``: the submission ended CANCELLED."""
        return self._sub.state is H.CANCELLED

    def running(self) -> bool:
        """``Future.running()``: not terminal yet."""
        return not self._sub.done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until terminal; re-raise the first failure, or CancelledError if it was cancelled (W1).

        ``TimeoutError`` if ``timeout`` seconds pass first (the submission keeps running).
        """
        sub = self._sub
        if not sub.done.wait(timeout):
            raise TimeoutError(f"submission still {sub.state.name} after {timeout} s")
        st = sub.state
        if st is H.FAILED:
            raise sub.errors[0]
        if st is H.CANCELLED:
            raise errors.CancelledError(self._cancel_reason())

    def result(self, timeout: float | None = None) -> Any:
        """:meth:`wait`, then the designated result: a task's value, or a callable's (called once)."""
        self.wait(timeout)
        sub = self._sub
        spec = sub.result_spec
        if spec is None:
            return None
        if isinstance(spec, Task):
            return spec.result
        assert sub.result_lock is not None
        with sub.result_lock:
            if sub.result_memo is None:
                try:
                    sub.result_memo = (True, spec())
                except Exception as e:
                    sub.result_memo = (False, e)
            ok, value = sub.result_memo
        if not ok:
            raise value
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """``Future.exception()``: the error ``result()`` would raise, or None; CancelledError if cancelled."""
        try:
            self.result(timeout)
        except errors.CancelledError:
            raise
        except TimeoutError:
            if not self.done():
                raise
            return self._sub.errors[0] if self._sub.errors else None
        except BaseException as e:
            return e
        return None

    @property
    def future(self) -> concurrent.futures.Future:
        """A ``concurrent.futures.Future`` completed with this submission's outcome once it is terminal.

        For ``concurrent.futures.wait`` / ``as_completed`` and ``asyncio.wrap_future`` (W4). Cancelling it
        cancels the submission; it is done only when the submission is terminal.
        """
        fut = self._future
        if fut is None:
            sub = self._sub
            with _future_lock:
                fut = self._future
                if fut is None:
                    fut = self._future = _handle_future(sub)
                    sub.scheduler._add_sub_callback(sub, lambda: _complete(fut, sub))
        return fut

    def add_done_callback(self, fn: Callable[[ExecutionHandle], Any]) -> None:
        """Call ``fn(handle)`` once, after the terminal state (now, if already there).

        Callbacks run on the thread that completed the submission, outside the scheduler lock; an
        exception in one is logged, never propagated into the scheduler.
        """
        self._sub.scheduler._add_sub_callback(self._sub, lambda: fn(self))

    # **** control ****

    def cancel(self) -> bool:
        """Request cancellation (idempotent, non-blocking; a no-op once terminal).

        Returns whether the submission was still live (so the request can take effect; W3).
        """
        live = not self._sub.done.is_set()
        self._sub.scheduler._cancel_submission(self._sub)
        return live

    def add(self, tasks: Iterable[Task] | Task) -> None:
        """Add tasks (with their unfinished dependencies) to this live submission.

        Raises RuntimeError once the submission is terminal. Added to a cancelled submission, they
        are cancelled at once (cancellation is level-triggered).
        """
        self._sub.scheduler._extend(self._sub, tasks)

    @property
    def diagnostics(self) -> Diagnostics:
        return self._sub.scheduler._diagnostics(self._sub)

    # **** integration: asyncio, with-blocks, destruction ****

    def __await__(self) -> Generator[Any, None, Any]:
        """``await handle`` gives ``result()``; a cancelled submission raises ``asyncio.CancelledError`` (W2);
        cancelling the awaiting task cancels the submission (as ``asyncio.wrap_future`` does)."""
        if not self.is_ready():
            import asyncio  # NOTE: imported here: 10 ms of start-up most sessions never need

            loop = asyncio.get_running_loop()
            fut = loop.create_future()

            def wake(_h: ExecutionHandle) -> None:
                with contextlib.suppress(RuntimeError):  # loop closed: nobody is awaiting any more
                    loop.call_soon_threadsafe(_settle, fut)

            self.add_done_callback(wake)
            try:
                yield from fut
            except asyncio.CancelledError:
                self.cancel()
                raise
        if self._sub.state is H.CANCELLED:
            import asyncio

            raise asyncio.CancelledError(self._cancel_reason())
        return self.result(timeout=0)

    def __enter__(self) -> ExecutionHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """Without an exception: wait (re-raising a failure). With one: cancel, join, let it propagate."""
        if exc_type is None:
            self.wait()
            return
        self.cancel()
        self._sub.done.wait()

    def __del__(self) -> None:
        sub = getattr(self, "_sub", None)
        if sub is None or sub.done.is_set() or sys.is_finalizing():
            return
        pool = current_pool()
        if pool is not None and sub.scheduler._owns_pool(pool):
            # NOTE: blocking here could wait for the very slot this thread holds (deadlock).
            _log().warning("live ExecutionHandle dropped on a scheduler worker; not waiting for it")
            return
        _log().debug("waiting for a live ExecutionHandle that was dropped before completion")
        sub.done.wait()

    def _cancel_reason(self) -> str:
        d = self.diagnostics
        if self._sub.cancel_requested:
            return "submission was cancelled"
        roots = {t.cause.name if t.cause is not None else t.name for t in d.cancelled}
        return f"submission depends on cancelled task(s): {', '.join(sorted(roots))}"

    def __repr__(self) -> str:
        return f"<ExecutionHandle {self._sub.state.name} tasks={len(self._sub.members)}>"


_future_class: type | None = None


def _handle_future(sub: _Submission) -> concurrent.futures.Future:
    """A new :class:`_HandleFuture` (the class is made on first use, under ``_future_lock``: its base
    module ``concurrent.futures._base`` imports ``logging``, which no start-up needs)."""
    global _future_class
    if _future_class is None:
        import concurrent.futures

        class _HandleFuture(concurrent.futures.Future):
            """The handle's ``concurrent.futures.Future``: ``cancel()`` cancels the submission; the outcome
            is set by :func:`_complete` when the submission is terminal (so done() means terminal, as for
            the handle)."""

            def __init__(self, sub: _Submission):
                super().__init__()
                self._submission = sub

            def cancel(self) -> bool:
                if self.done():
                    return self.cancelled()
                self._submission.scheduler._cancel_submission(self._submission)
                return True

        _future_class = _HandleFuture
    return _future_class(sub)


def _complete(fut: concurrent.futures.Future, sub: _Submission) -> None:
    """Copy a terminal submission's outcome into its future (a done callback; never raises)."""
    if fut.done():
        return
    if sub.state is H.CANCELLED:
        import concurrent.futures  # loaded with the future's class

        concurrent.futures.Future.cancel(fut)
        fut.set_running_or_notify_cancel()  # wakes concurrent.futures.wait / as_completed
        return
    try:
        value = ExecutionHandle(sub).result(timeout=0)
    except Exception as e:
        fut.set_exception(e)
    else:
        fut.set_result(value)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

