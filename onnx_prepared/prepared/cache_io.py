"""File operations of the companion cache: locks, aligned payload files, atomic publication, cleanup.

Crash safety comes from ordering, not from recovery code (spec: "an interrupted update leaves either
the previous complete generation or the new complete generation visible"):

1. payloads go to a temporary data file (``.<root>.<id>.data.tmp``), flock-ed by its writer so a
   cleaner can tell a live writer from a dead one, and are fsync-ed;
2. under the exclusive inter-process lock (``<root>.lock``) the data file is renamed to its final
   name (``<root>.<id>.data``), then a temporary index is written, fsync-ed and ``os.replace``-d
   over the companion; the folder is fsync-ed after each rename;
3. still under the lock, data files no longer referenced are deleted (only names matching this
   cache's patterns), as are temporary files left by writers that died.

A SIGKILL anywhere leaves the old index pointing at old, untouched data files, plus at worst an
orphan file that step 3 of the next writer removes.

Without locks (``ONNX_PREPARED_CACHE_LOCKING=0``, or automatically where ``flock`` fails with ENOLCK or
EOPNOTSUPP, as on some network filesystems) correctness rests on what every such filesystem keeps:
unique file names (random generation ids, ``O_EXCL``), data written and fsync-ed before it is renamed
into place, and an atomic ``os.replace`` of the index, so a reader sees one complete generation or the
next. What locking added is then weakened, never turned into corruption: two writers publishing at once
may drop one's entries from the index (a writer replaces the index only if it is still the one it merged
with, checked right before the rename, and re-reads after publishing and merges again, a bounded number
of times; what a race inside that last instant still loses is a miss for the next replica), and step 3
removes only files older than ``LOCKLESS_GRACE_S``, since a fresh unreferenced file may belong to a writer
that has not published yet.

``checkpoint`` marks each step for the crash tests (tests/prepared/test_cache_processes.py); it does
nothing otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from onnx_prepared.errors import CacheError
from onnx_prepared.model.reader_map import map_readonly
from onnx_prepared.model.safe_open import NotRegularFile, file_kind, open_regular, read_regular
from onnx_prepared.prepared import payload_hash
from onnx_prepared.prepared.cache_format import (
    ALIGNMENT,
    ID_SIZE,
    CacheEntry,
    CompanionIndex,
    data_file_pattern,
    decode,
    parse,
    temp_file_pattern,
)

try:
    import fcntl
except ImportError:  # NOTE: not POSIX (Windows): no inter-process locking, single writer assumed
    fcntl = None  # type: ignore[assignment]

_SAFE = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
_CHUNK = 16 << 20
#: A companion index holds metadata only (a few hundred bytes per entry): a larger file is not one.
INDEX_LIMIT = 256 << 20


#: Set to 0 / off / none / false to use the cache without flock (a network filesystem without locks).
LOCKING_ENV = "ONNX_PREPARED_CACHE_LOCKING"
#: Without locks, cleanup removes an unreferenced data file or temporary file only once it is this old.
LOCKLESS_GRACE_S = 3600.0
#: flock errors meaning "this filesystem does not lock", not "someone holds the lock".
_NO_LOCKS = frozenset(getattr(errno, n) for n in ("ENOLCK", "EOPNOTSUPP", "ENOTSUP", "ENOSYS") if hasattr(errno, n))


def locking_from_env() -> bool:
    """False when ``$ONNX_PREPARED_CACHE_LOCKING`` disables locks; True otherwise (the default)."""
    return os.environ.get(LOCKING_ENV, "1").strip().lower() not in ("0", "off", "none", "false", "no")


def flock_works(fd: int) -> bool:
    """Whether ``flock`` works on ``fd``'s filesystem (a probe: a non-blocking shared lock, released)."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in _NO_LOCKS:
            return False
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True  # held exclusively by a writer right now: locks work
        raise
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def checkpoint(stage: str) -> None:
    """Hook between the steps of a flush; crash and race tests replace it (no-op in production)."""


# ---- locks -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def flocked(fd: int | None, exclusive: bool) -> Iterator[None]:
    """Hold ``flock`` on ``fd`` (shared or exclusive) for the block; a None fd locks nothing."""
    if fd is None or fcntl is None:
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def open_lock(path: str, *, create: bool) -> int | None:
    """The lock file's descriptor; None if it does not exist and ``create`` is False (read-only use)."""
    flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | _SAFE
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        return None
    except PermissionError:
        if create:
            raise
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device here would block or lie about locking
        mode = os.fstat(fd).st_mode
        os.close(fd)
        raise CacheError(f"cache lock {path!r} is not a regular file (it is a {file_kind(mode)})")
    return fd


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


# ---- payload files ---------------------------------------------------------------------------------


def new_id() -> str:
    import secrets  # NOTE: lazy: only a writer names files (random, base64, hmac: ~3 ms a hit's constructor skips)

    return secrets.token_hex(8)


def create_temp_data(folder: str, root: str, gen_id: str, *, lock: bool = True) -> tuple[str, int]:
    """Create and flock a new temporary data file; (path, fd). Call under the shared cache lock.
    ``lock=False`` (no locks on this filesystem): not flock-ed; cleanup goes by its age instead."""
    path = os.path.join(folder, f".{root}.{gen_id}.data.tmp")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    if fcntl is not None and lock:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or when the process dies
    return path, fd


def write_payloads(fd: int, payloads: list[tuple[np.ndarray, bytes]]) -> list[tuple[int, int, str]]:
    """Write each (payload, identity record) at an ALIGNMENT-aligned offset, the record right after the
    payload; fsync. Returns [(offset, length, hex XXH3-128 of the payload)]."""
    out, pos = [], 0
    for arr, record in payloads:
        mv = memoryview(arr).cast("B")
        n, done = len(mv), 0
        while done < n:
            done += os.pwrite(fd, mv[done:done + _CHUNK], pos + done)
        done = 0
        while done < len(record):
            done += os.pwrite(fd, record[done:], pos + n + done)
        out.append((pos, n, payload_hash.checksum(mv)))
        pos += -(-(n + len(record)) // ALIGNMENT) * ALIGNMENT
    os.fsync(fd)
    return out


def fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: str, data: bytes, root: str, *, unchanged: Callable[[], bool] | None = None) -> bool:
    """Replace ``path`` by ``data``: temporary file, fsync, ``os.replace``, fsync the folder; True.

    ``unchanged`` (without locks): asked right before the replace; False drops the temporary file and
    returns False, leaving ``path`` as it is (another writer replaced it since the caller read it).
    """
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".{root}.{new_id()}.onnx.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            mv, done = memoryview(data), 0
            while done < len(mv):
                done += os.write(fd, mv[done:])
            os.fsync(fd)
        finally:
            os.close(fd)
        checkpoint("manifest_written")
        if unchanged is not None and not unchanged():
            os.unlink(tmp)
            return False
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return True


def open_payload_file(file: str) -> tuple[int | None, int, str]:
    """(fd, size, problem) for a data file: fd None and a reason if it is missing or not a regular file."""
    try:
        fd, st = open_regular(file)
    except FileNotFoundError:
        return None, 0, "payload file is missing"
    except NotRegularFile as e:
        return None, 0, f"payload file is not a regular file (it is a {e.kind})"
    except OSError as e:
        return None, 0, f"cannot open payload file: {e.strerror or e}"
    return fd, st.st_size, ""


def pread_into(fd: int, buf: np.ndarray, offset: int, record: bytearray | None = None, *,
               hasher=None) -> int:
    """Fill ``buf`` (then ``record``) from ``offset``; returns bytes read (fewer only at end of file).

    Without ``hasher``: one ``preadv`` for both. With one: ``buf`` is read in ``payload_hash.CHUNK``
    pieces and each piece goes to ``hasher.update`` right after its read, while still in cache (the
    record rides with the last piece and is not hashed); the GIL is released by both calls.
    """
    n = buf.size
    views = [memoryview(buf).cast("B")] + ([memoryview(record)] if record is not None else [])
    if hasher is None:
        return _preadv_all(fd, views, offset)
    got, step = 0, payload_hash.CHUNK
    while True:
        last = n - got <= step
        iov = [views[0][got:n]] + views[1:] if last else [views[0][got:got + step]]
        want = sum(len(v) for v in iov)
        k = _preadv_all(fd, iov, offset + got)
        hasher.update(views[0][got:got + min(k, n - got)])
        got += k
        if last or k < want:
            return got


def _preadv_all(fd: int, views: list[memoryview], offset: int) -> int:
    total, got = sum(len(v) for v in views), 0
    while got < total:
        iov, skip = [], got
        for v in views:
            if skip >= len(v):
                skip -= len(v)
                continue
            iov.append(v[skip:])
            skip = 0
        n = os.preadv(fd, iov, offset + got)
        if n == 0:
            break
        got += n
    return got


#: Set to 0 / off / no / false to copy payloads into fresh buffers with ``preadv`` instead of mapping them.
MAP_ENV = "ONNX_PREPARED_CACHE_MMAP"


def mapping_from_env() -> bool:
    """False when ``$ONNX_PREPARED_CACHE_MMAP`` disables mapped payloads, or the platform has no
    ``MAP_POPULATE``; True otherwise (the default on Linux)."""
    return hasattr(mmap, "MAP_POPULATE") and os.environ.get(MAP_ENV, "1").strip().lower() not in (
        "0", "off", "none", "false", "no")


def map_payload(fd: int, offset: int, length: int) -> tuple[np.ndarray, int] | None:
    """A read-only uint8 array over a shared mapping of ``length`` bytes at ``offset`` (read ahead into
    the page cache by ``MAP_POPULATE``, with the GIL released; no descriptor kept: model/reader_map.py),
    and where those bytes start in it; None when the file is shorter than that now (the caller reports the
    truncation; mapping it would fault with SIGBUS).

    Why a mapping and not a copy: a fresh process's buffers are fresh anonymous memory, and faulting in
    (zeroing) 127 MB of it costs more than reading the bytes (measured on the medium preset, a complete
    companion, 65 entries: ``preadv`` into new ``np.empty`` buffers 56-160 ms cold or warm, into
    ``MAP_POPULATE``-d anonymous memory 45-77 ms, a populated file mapping 26-38 ms cold, 1.6 ms warm).
    A mapping relies on the data file never shrinking in place; onnx-prepared never rewrites one
    (every generation is a new file, see the module docstring), but see docs/serving.md for what else
    may (and ``MAP_ENV`` to turn mapping off).
    """
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    if os.fstat(fd).st_size < offset + length:
        return None
    return map_readonly(fd, start, offset + length - start), offset - start


def checksum_range(fd: int, offset: int, length: int) -> tuple[str, int]:
    """(hex XXH3-128, bytes read) of ``length`` bytes at ``offset``, read in bounded chunks (for verify)."""
    buf = np.empty(min(length, payload_hash.CHUNK), dtype=np.uint8)
    h, done = payload_hash.hasher(), 0
    while done < length:
        n = min(length - done, buf.size)
        got = _preadv_all(fd, [memoryview(buf[:n])], offset + done)
        h.update(memoryview(buf[:got]))
        done += got
        if got < n:
            break
    return h.hexdigest(), done


# ---- cleanup ---------------------------------------------------------------------------------------


def cleanup(folder: str, root: str, referenced: set[str], *, min_age: float = 0.0) -> list[str]:
    """Delete this cache's unreferenced data files and dead writers' temporary files; returns names removed.

    Call only under the exclusive cache lock: a live writer's temporary data file is flock-ed (skipped),
    and temporary indexes exist only inside the lock, so any seen here belongs to a dead writer. Without
    locks pass ``min_age`` (``LOCKLESS_GRACE_S``): only files unmodified for that long are removed.
    """
    own, temp, removed = data_file_pattern(root), temp_file_pattern(root), []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        path = os.path.join(folder, name)
        if own.fullmatch(name) and name not in referenced:
            pass
        elif (m := temp.fullmatch(name)) is not None:
            if not min_age and m.group(1) == "data" and not _dead_writer(path):
                continue
        else:
            continue
        if min_age:
            try:
                if now - os.lstat(path).st_mtime < min_age:
                    continue
            except FileNotFoundError:
                continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(name)
    return removed


def _dead_writer(path: str) -> bool:
    try:
        fd, _ = open_regular(path, follow=False)
    except OSError:
        return False
    try:
        return _try_lock(fd)
    finally:
        os.close(fd)


# ---- companion index and payload files, read side -------------------------------------------------------


def inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def read_index(path: str) -> tuple[CompanionIndex | None, int | None]:
    """(decoded companion index, its inode); (None, None) if there is no companion. Raises CacheError if it
    cannot be parsed."""
    try:
        data, st = read_regular(path, limit=INDEX_LIMIT)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        raise CacheError(f"cannot read companion prepared model {path!r}: {e.strerror or e}") from None
    ino = st.st_ino
    try:
        model = parse(data, path)
    except ValueError as e:
        raise CacheError(str(e)) from None
    return decode(model, path), ino


def open_files(entries: Iterable[CacheEntry]) -> tuple[dict[str, int], dict[str, str]]:
    """Open each data file once: (file -> fd, entry name -> reason for entries whose bytes are not there)."""
    fds: dict[str, int] = {}
    sizes: dict[str, tuple[int, str]] = {}
    invalid: dict[str, str] = {}
    for e in entries:
        if e.file not in sizes:
            fd, size, why = open_payload_file(e.file)
            sizes[e.file] = (size, why)
            if fd is not None:
                fds[e.file] = fd
        size, why = sizes[e.file]
        if why:
            invalid[e.key_name] = f"{why}: {e.location or e.file}"
        elif e.offset + e.length + ID_SIZE > size:
            invalid[e.key_name] = (f"payload file truncated: {e.location or e.file} has {size} bytes, the entry "
                                   f"needs {e.offset}..{e.offset + e.length + ID_SIZE} (payload and identity record)")
    return fds, invalid


def close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)
