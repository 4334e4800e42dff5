"""Progress bars for long work: tqdm on a terminal, nothing otherwise (and nothing unless asked).

Library code never prints on its own: a caller passes ``progress=True`` (a bar when stderr is a
terminal and tqdm is installed) or a callable ``fn(done, total)``; the CLI passes True.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Progress = Callable[[int, int], Any]


class _Bar:
    def __init__(self, total: int, desc: str, unit: str):
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)

    def __call__(self, done: int, total: int) -> None:
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(max(0, done - self._bar.n))
        if done >= total:
            self._bar.close()


def reporter(progress: bool | Progress | None, total: int, desc: str, unit: str = "obj") -> Progress | None:
    """A ``fn(done, total)`` for ``progress`` (None/False: None; True: a tqdm bar if stderr is a terminal)."""
    if progress is None or progress is False or total <= 0:
        return None
    if callable(progress):
        return progress
    if not sys.stderr.isatty():
        return None
    try:
        return _Bar(total, desc, unit)
    except ImportError:
        return None
