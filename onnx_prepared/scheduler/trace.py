"""Per-task trace records, exportable as Chrome trace JSON (opens in Perfetto / chrome://tracing).

Disabled tracing costs one ``is None`` check per task run. Enabled, each run segment appends one tuple
(list.append is atomic under the GIL, so workers need no lock); records become objects only on export.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from onnx_prepared.records import record

_PRIORITY = ("critical", "prefetch", "background")


@record(frozen=True, slots=True)
class TraceRecord:
    """One run segment of a task; times are ``time.perf_counter()`` seconds."""

    name: str
    resource: str
    priority: str
    nbytes: int
    queued: float  # became READY (dependencies succeeded)
    started: float
    finished: float
    outcome: str  # succeeded / failed / cancelled / resumed
    worker: str  # thread name
    thread_id: int


class Trace:
    """Collects records while the scheduler runs; thread-safe to read at any time."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self._rows: list[tuple[Any, ...]] = []

    def _add(self, name: str, resource: str, prio: int, nbytes: int, queued: float, started: float,
             finished: float, outcome: str) -> None:
        th = threading.current_thread()
        self._rows.append((name, resource, prio, nbytes, queued, started, finished, outcome, th.name, th.ident))

    def clear(self) -> None:
        self._rows = []

    def records(self) -> list[TraceRecord]:
        return [
            TraceRecord(r[0], r[1], _PRIORITY[r[2]], r[3], r[4], r[5], r[6], r[7], r[8], r[9] or 0)
            for r in list(self._rows)
        ]

    def to_chrome(self) -> dict[str, Any]:
        """``{"traceEvents": [...]}`` with one "X" complete event per run segment, one tid per worker."""
        pid = os.getpid()
        recs = self.records()
        tids: dict[int, int] = {}
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "onnx_prepared scheduler"}}
        ]
        for r in recs:
            if r.thread_id not in tids:
                tids[r.thread_id] = len(tids) + 1
                events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tids[r.thread_id],
                               "args": {"name": r.worker}})
        for r in recs:
            events.append({
                "name": r.name, "cat": r.resource, "ph": "X", "pid": pid, "tid": tids[r.thread_id],
                "ts": (r.started - self.origin) * 1e6, "dur": max(0.0, (r.finished - r.started) * 1e6),
                "args": {"priority": r.priority, "bytes": r.nbytes, "outcome": r.outcome,
                         "queued_us": max(0.0, (r.started - r.queued) * 1e6)},
            })
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_chrome` as JSON; returns the path."""
        p = Path(path)
        import json  # only saving a trace needs it

        p.write_text(json.dumps(self.to_chrome()))
        return p
