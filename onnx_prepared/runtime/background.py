"""Work started on a thread of its own without waiting for that thread to run.

``threading.Thread.start`` returns only once the new thread runs. On a 2-vCPU VM whose other core is
busy (numpy's OpenBLAS thread spins for some 60-90 ms after ``import numpy``; the read-ahead streams)
that is often one scheduler slice: 1-4 ms per thread, measured in a fresh process right after
``import numpy``, against 0.1 ms a minute later. Session construction starts some 8 threads (the
scheduler's pools, the read-ahead's), so it hands that work to :class:`Background` and goes on with
its parse and resolution meanwhile. ``_thread.start_new_thread`` returns at once.
"""

from __future__ import annotations

import _thread
from collections.abc import Callable
from typing import Any


class Background:
    """``fn(*args)`` running on a new thread; :meth:`result` waits for it and returns its value or
    re-raises its error (every call does). Thread-safe.

    >>> job = Background(sum, [1, 2])
    >>> job.result()
    3
    """

    __slots__ = ("_done", "_error", "_value")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._done = _thread.allocate_lock()
        self._done.acquire()  # released by the thread when fn returned or raised
        self._value: Any = None
        self._error: BaseException | None = None
        start_thread(self._run, fn, args)

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # handed to the waiter
            self._error = e
        finally:
            self._done.release()

    def result(self) -> Any:
        with self._done:
            pass
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def done(self) -> bool:
        return not self._done.locked()


def start_thread(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on a new thread, returning at once (a daemon thread: the interpreter's exit
    does not wait for it). ``fn`` handles its own errors (an escaping one is printed, as for any thread)."""
    _thread.start_new_thread(fn, args)
