"""Read-only file mappings that hold no file descriptor.

Python's ``mmap.mmap`` keeps a ``dup`` of the descriptor it maps for as long as the mapping lives
(``trackfd=False`` exists only from Python 3.13). A cold start maps every companion payload (65 on the
medium preset) or every 4-bit prepack source (about 90), so the process crossed 64 open descriptors in
the middle of its first run, and the kernel grew the descriptor table: in a multi-threaded process
that waits for an RCU grace period, and every thread opening a file meanwhile waits with it. Traced
with ``perf record -e sched:sched_switch`` on a cold medium run (128 tokens, complete companion, this
2-vCPU VM): the run's thread and three I/O workers blocked in ``expand_files`` for 11 ms at once, 37 ms
into the run. :func:`map_readonly` calls ``mmap(2)`` through ctypes instead (the GIL released during the
call, as ``mmap.mmap`` does) and returns a read-only uint8 array whose base owns the mapping: it is unmapped
when the last array viewing it is gone. Where libc has no ``mmap`` (not POSIX) it falls back to
``mmap.mmap``.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

_libc = None  # (mmap, munmap), () where there is none; loaded on first use


def _calls() -> tuple:
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            fmap, funmap = lib.mmap, lib.munmap
        except (OSError, AttributeError):
            _libc = ()
            return _libc
        fmap.restype = ctypes.c_void_p
        fmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
        funmap.restype = ctypes.c_int
        funmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = (fmap, funmap)
    return _libc


_FAILED = ctypes.c_void_p(-1).value  # MAP_FAILED


def map_readonly(fd: int, offset: int, length: int, *, populate: bool = True) -> np.ndarray:
    """A read-only uint8 array of ``length`` (> 0) bytes of ``fd`` from ``offset`` (a multiple of
    ``mmap.ALLOCATIONGRANULARITY``), shared with the page cache; ``populate`` reads every page in first
    (``MAP_POPULATE``). The mapping lives until this array and every view of it are gone. Raises OSError
    as ``mmap`` does (ENODEV: this file cannot be mapped). In CPython the unmapping is immediate once
    the last reference goes (``del``), as ``mmap.close()`` was."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    calls = _calls()
    if not calls:
        a = np.frombuffer(mmap.mmap(fd, length, flags=flags, prot=mmap.PROT_READ, offset=offset), np.uint8)
        a.flags.writeable = False
        return a
    addr = calls[0](None, length, mmap.PROT_READ, flags, fd, offset)
    if addr is None or addr == _FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return np.asarray(_Mapping(addr, length, calls[1]))


class _Mapping:
    """Owns one ``mmap(2)`` region; numpy reads it through ``__array_interface__`` (read-only)."""

    __slots__ = ("__array_interface__", "_addr", "_length", "_munmap")

    def __init__(self, addr: int, length: int, munmap) -> None:
        self._addr, self._length, self._munmap = addr, length, munmap
        self.__array_interface__ = {"data": (addr, True), "shape": (length,), "typestr": "|u1", "version": 3}

    def close(self) -> None:
        if self._addr is not None:
            addr, self._addr = self._addr, None
            self._munmap(addr, self._length)

    def __del__(self) -> None:
        self.close()


def is_mapped(a: object) -> bool:
    """Whether array ``a`` views a file mapping (:func:`map_readonly`'s, or an ``mmap.mmap``) somewhere
    down its ``base`` chain."""
    while a is not None:
        if isinstance(a, (_Mapping, mmap.mmap)):
            return True
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return False
