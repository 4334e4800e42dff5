"""The one way this package opens a file it reads: never blocks, never follows a swapped-in symlink,
never reads anything but a regular file, never reads more than ``fstat`` says.

A FIFO, ``/dev/zero`` or a socket given as a model, data file, companion index or payload would
otherwise block ``open()`` forever or read until memory runs out. So every open is
``O_NONBLOCK | O_NOFOLLOW`` on the caller's already-resolved real path, then ``fstat``, and anything
that is not a regular file is refused with :class:`NotRegularFile` (an ``OSError``, so callers map it
to their own error type together with the other open failures). ``fingerprint`` is the stat identity
(device, inode, size, mtime_ns, ctime_ns) a content digest is trusted under; ``FdPool`` keeps the
descriptors of many files open under a bound so thousands of external files work under a low
``ulimit -n``.
"""

from __future__ import annotations

import errno
import io
import os
import resource
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: what open(O_NOFOLLOW) sets when the last component is a symlink (Linux ELOOP, the BSDs EMLINK)
_SYMLINK_ERRNOS = (errno.ELOOP, errno.EMLINK)
_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)


class NotRegularFile(OSError):
    """The path names a FIFO, device, socket or directory: refused without reading it."""

    def __init__(self, path: str, mode: int) -> None:
        self.kind = file_kind(mode)
        super().__init__(errno.EINVAL, f"not a regular file (it is a {self.kind})", path)


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink")):
        if test(mode):
            return name
    return "special file"


def open_regular(path: str, *, follow: bool = True) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file at ``path``, opened read-only without blocking.

    ``follow=True`` resolves symlinks first (the user's own path, e.g. a hub cache's blob link) and
    then opens the real path with ``O_NOFOLLOW``; ``follow=False`` refuses a symlink (ELOOP) for
    paths that were resolved and validated earlier. Raises ``OSError`` (``NotRegularFile`` for a FIFO,
    device, socket or directory).
    """
    if follow:
        # the path itself first: O_NOFOLLOW refuses only a symlink as the last component (the kernel
        # resolves the directories either way), and only then is the path resolved (realpath's lstat
        # per component was two thirds of reading a small model file: ~36 of ~53 us)
        try:
            fd = os.open(path, _FLAGS)
        except OSError as e:
            if e.errno not in _SYMLINK_ERRNOS:
                raise
            fd = os.open(os.path.realpath(path), _FLAGS)
    else:
        fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str, *, follow: bool = True,
                 limit: int | None = None) -> tuple[bytes | bytearray, os.stat_result]:
    """The whole content of a regular file (at most its ``fstat`` size) and its stat.

    ``limit`` refuses a larger file with ``OSError(EFBIG)`` before any buffer is allocated. One read of
    the stat size into a fresh ``bytes`` (no zero-filled buffer to copy into: a 6 MB model read in
    1.2 ms instead of 2.1); a short read continues until the size or end of file.
    """
    fd, st = open_regular(path, follow=follow)
    try:
        size = st.st_size
        if limit is not None and size > limit:
            raise OSError(errno.EFBIG, f"file is {size} bytes, more than the {limit}-byte limit", path)
        if size > _ONE_READ:  # one preallocated buffer (os.read caps a call at ~2 GB: no joined copy)
            buf, got = bytearray(size), 0
            with io.FileIO(fd, "rb", closefd=False) as f:
                mv = memoryview(buf)
                while got < size:
                    n = f.readinto(mv[got:])
                    if not n:
                        break
                    got += n
                mv.release()
            del buf[got:]
            return buf, st
        with io.FileIO(fd, "rb", closefd=False) as f:
            data = f.read(size) if size else b""
            if len(data) < size:
                parts, got = [data], len(data)
                while got < size:
                    chunk = f.read(size - got)
                    if not chunk:
                        break  # shrank while reading: the caller's parser sees a truncated file
                    parts.append(chunk)
                    got += len(chunk)
                data = b"".join(parts)
        return data, st
    finally:
        os.close(fd)


_ONE_READ = 1 << 30


def fingerprint(st: os.stat_result) -> str:
    """``dev:ino:size:mtime_ns:ctime_ns``: equal while the file's bytes are the ones hashed under it.

    ``ctime_ns`` cannot be set from user space, so a rewrite that restores ``mtime`` still changes it.
    """
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def changed_within(st: os.stat_result, seconds: float) -> bool:
    """Whether the file changed (mtime or ctime) less than ``seconds`` ago. Timestamps come from a coarse
    clock (a few ms), so a rewrite in place that soon after a hash could keep the fingerprint: such a
    file is "racily clean" (as git calls it) and its hash is not remembered."""
    return max(st.st_mtime_ns, st.st_ctime_ns) > time.time_ns() - int(seconds * 1e9)


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None when the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_fd_bound() -> int:
    """Descriptors one pool may hold: a quarter of the soft ``RLIMIT_NOFILE``, between 8 and 256."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        soft = 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1024
    return max(8, min(256, soft // 4))


class FdPool:
    """LRU pool of read-only descriptors keyed by path, at most ``bound`` open at once.

    ``acquire`` returns a descriptor the caller uses until ``release``; a descriptor in use is never
    closed under its reader (an evicted one closes at its last release). Every (re)open goes through
    ``opener``, so a file replaced since the last open is checked again.
    """

    def __init__(self, opener: Callable[[str], int], bound: int | None = None) -> None:
        self._opener = opener
        self._bound = bound or None  # None: default_fd_bound() at the first use (a session that opens no
        # data file, one with inline weights, asks no getrlimit)
        self._lru: OrderedDict[str, int] = OrderedDict()  # path -> fd, open and poolable
        self._users: dict[int, int] = {}  # fd -> readers holding it
        self._doomed: set[int] = set()  # evicted while in use: closed at last release
        self._lock = threading.Lock()
        self.opens = 0

    @property
    def bound(self) -> int:
        """Descriptors the pool holds at most (the caller's, else :func:`default_fd_bound`)."""
        b = self._bound
        if b is None:
            b = self._bound = default_fd_bound()
        return b

    def acquire(self, path: str) -> int:
        with self._lock:
            fd = self._lru.get(path)
            if fd is not None:
                self._lru.move_to_end(path)
                self._users[fd] = self._users.get(fd, 0) + 1
                return fd
        fd = self._opener(path)  # outside the lock: an open may be slow (network filesystems)
        close: list[int] = []
        with self._lock:
            self.opens += 1
            old = self._lru.get(path)
            if old is not None:  # another thread opened it meanwhile: use theirs
                close.append(fd)
                fd = old
                self._lru.move_to_end(path)
            else:
                self._lru[path] = fd
                while len(self._lru) > self.bound:
                    _, victim = self._lru.popitem(last=False)
                    if self._users.get(victim):
                        self._doomed.add(victim)
                    else:
                        close.append(victim)
            self._users[fd] = self._users.get(fd, 0) + 1
        for c in close:
            os.close(c)
        return fd

    def release(self, fd: int) -> None:
        with self._lock:
            n = self._users.get(fd, 0) - 1
            if n > 0:
                self._users[fd] = n
                return
            self._users.pop(fd, None)
            if fd not in self._doomed:
                return
            self._doomed.discard(fd)
        os.close(fd)

    def discard(self, path: str) -> None:
        """Forget ``path``'s descriptor (closed now, or at its last release)."""
        with self._lock:
            fd = self._lru.pop(path, None)
            if fd is None:
                return
            if self._users.get(fd):
                self._doomed.add(fd)
                return
        os.close(fd)

    def close(self) -> None:
        """Close every idle descriptor; ones in use close at their release. Idempotent."""
        with self._lock:
            fds, self._lru = list(self._lru.values()), OrderedDict()
            idle = [fd for fd in fds if not self._users.get(fd)]
            self._doomed.update(fd for fd in fds if self._users.get(fd))
        for fd in idle:
            os.close(fd)

    def __len__(self) -> int:
        return len(self._lru)
