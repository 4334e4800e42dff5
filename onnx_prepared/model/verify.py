"""Background verification of model checksums, off the read's critical path.

Semantics (docs/reliability.md, "Model checksums"): bytes read from a tensor whose external data
records a sha256 may be handed to their consumer before they are verified; their hash runs on this
module's thread meanwhile (sha256 in ``CHUNK`` pieces, GIL released). A run or a ``prepare()`` that
may have used them calls ``check()`` before it completes: it waits for every verification queued so
far and raises the first mismatch as an ``ExternalDataError``. The failure is level-triggered: every
later ``check()`` raises it again, because objects prepared from those bytes are still resident. So
a run that consumed bad bytes never returns a result. Bytes that are persisted (a writable
companion) are verified before they are published, never here (the reader hashes them inline).

The backlog is bounded (``max_pending_bytes``; the reader passes 256 MiB, or a quarter of its memory
limit): past it ``submit`` refuses and the reading thread verifies inline, which slows reads down to
the hash's pace instead of keeping released buffers alive.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from onnx_prepared.errors import ExternalDataError

#: Bytes hashed per ``update`` (each call releases the GIL; a close is seen between pieces).
CHUNK = 8 << 20


def sha256_chunked(buf: np.ndarray, stop: Callable[[], bool] | None = None) -> str | None:
    """Hex sha256 of a 1-D uint8 array, hashed in ``CHUNK`` pieces; None if ``stop()`` turned true."""
    import hashlib  # OpenSSL loads with the first hash, not with the package

    h, mv = hashlib.sha256(), memoryview(buf).cast("B")
    for i in range(0, len(mv), CHUNK):
        if stop is not None and stop():
            return None
        h.update(mv[i:i + CHUNK])
    return h.hexdigest()


class ChecksumVerifier:
    """One lazily started thread that runs queued verification jobs; thread-safe.

    A job is ``fn() -> ExternalDataError | None``; the first error returned is kept and raised by every
    later ``check()``. The thread exits when the queue is empty (an idle session holds no thread).
    """

    def __init__(self, max_pending_bytes: int = 256 << 20) -> None:
        self.max_pending_bytes = max_pending_bytes
        self._cv = threading.Condition()
        self._queue: deque[tuple[Callable[[], ExternalDataError | None], int]] = deque()
        self._pending = 0  # jobs queued or running; 0 <-> every submitted job finished
        self._pending_bytes = 0
        self._running = False  # a worker thread is alive (it clears this under _cv before exiting)
        self._closed = False
        self.failure: ExternalDataError | None = None  # the first mismatch; set once, never cleared

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, job: Callable[[], ExternalDataError | None], nbytes: int) -> bool:
        """Queue ``job`` (verifying ``nbytes`` bytes); False if the caller must run it itself (closed, or
        the backlog would exceed ``max_pending_bytes``)."""
        with self._cv:
            if self._closed or (self._pending and self._pending_bytes + nbytes > self.max_pending_bytes):
                return False
            self._queue.append((job, nbytes))
            self._pending += 1
            self._pending_bytes += nbytes
            if not self._running:
                self._running = True
                threading.Thread(target=self._work, name="onnx-prepared-verify", daemon=True).start()
        return True

    def fail(self, err: ExternalDataError) -> None:
        """Record a mismatch found elsewhere (an inline verification), so ``check()`` raises it too."""
        with self._cv:
            if self.failure is None:
                self.failure = err

    def check(self) -> None:
        """Wait until every job submitted so far has run; raise the first mismatch (again on every call)."""
        if self._pending or self.failure is not None:  # NOTE: unlocked fast path for hot runs
            with self._cv:
                while self._pending:
                    self._cv.wait()
                err = self.failure
            if err is not None:
                raise copy.copy(err)  # a fresh instance per raise: tracebacks do not pile up on one

    def close(self) -> None:
        """Drop queued jobs and stop after the running one (which stops at its next chunk). Idempotent."""
        with self._cv:
            self._closed = True
            self._pending -= len(self._queue)
            self._pending_bytes -= sum(n for _, n in self._queue)
            self._queue.clear()
            self._cv.notify_all()

    def _work(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    self._running = False
                    return
                job, nbytes = self._queue.popleft()
            try:
                err = job()
            except BaseException as e:  # an internal failure must not leave check() waiting forever
                err = ExternalDataError(f"checksum verification failed: {e!r}")
            with self._cv:
                if err is not None and self.failure is None:
                    self.failure = err
                self._pending -= 1
                self._pending_bytes -= nbytes
                self._cv.notify_all()
