"""Put a model's files in a page-cache state: ``cold`` (evicted with posix_fadvise) or ``warm`` (read once)."""

from __future__ import annotations

import os
from collections.abc import Iterable

_MB = 1 << 20


def model_files(path: str) -> list[str]:
    """The model file and the external-data files beside it (what a cold start reads)."""
    folder = os.path.dirname(os.path.abspath(path))
    return [path] + sorted(os.path.join(folder, f) for f in os.listdir(folder)
                           if f.endswith((".data", ".bin")) and os.path.isfile(os.path.join(folder, f)))


def evict(paths: Iterable[str]) -> None:
    """Drop the files' clean pages: ``posix_fadvise(POSIX_FADV_DONTNEED)`` after a ``fdatasync``."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Iterable[str]) -> None:
    """Read the files once so every page is cached."""
    buf = bytearray(16 * _MB)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            off = 0
            while n := os.preadv(fd, [buf], off):
                off += n
        finally:
            os.close(fd)


def set_state(paths: list[str], state: str) -> None:
    evict(paths) if state == "cold" else warm(paths)
