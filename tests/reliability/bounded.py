"""Run a case so that a hang fails the test instead of the suite: a daemon worker thread and a join timeout."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: Seconds a single hostile case may take before it counts as a hang (generous: the machine is shared).
HANG_SECONDS = 30.0


class Hang(AssertionError):
    pass


def bounded(fn: Callable[[], Any], timeout: float = HANG_SECONDS) -> tuple[Any, BaseException | None]:
    """(result, exception) of ``fn()`` run on a worker thread; raises Hang if it has not returned in time."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # the caller classifies every outcome
            out["error"] = e

    t = threading.Thread(target=body, daemon=True, name="bounded-case")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise Hang(f"case did not finish within {timeout} s (a hang)")
    return out.get("value"), out.get("error")
