"""Cold-start read-ahead: the bytes a first run reads, streamed into the page cache ahead of it.

A cold run's I/O workers read one tensor each (a populated mapping per transient source or companion
payload), on the cores the run computes on, from the moment the run is submitted. :class:`ReadAhead`
starts earlier, during construction: ``threads`` threads read the byte ranges in order, in pieces of
``piece`` bytes, each with one ``sendfile`` to /dev/null: the kernel reads the piece into the page cache
(its readahead streams it) and copies nothing to user space, and the thread holds no GIL for the piece
(``os.preadv`` into a reused buffer where ``sendfile`` cannot). Nothing read is kept or returned (the
bytes only land in the page cache), so integrity is unchanged: the session's own reads still map,
check and verify what they consume, and then find their pages resident. A piece in flight makes a
session read of it wait for it, as two session reads of one page would.

The session queues two batches (runtime/builder.py): a companion's payloads (:func:`companion_ranges`,
in file order) as soon as the companion is open, before resolution (when the options name the
companion, from its index before the source's parse, :func:`index_ranges`, dropped if the parse shows it
stale), or without a usable companion entry
the source's external initializers less the tables a Gather reads (:func:`load_ranges`, in file order)
right after the load; then what the plan's cold first run
reads (:func:`plan_ranges`, in need order: per requirement its companion payload on a hit or its
external sources; a row table read only by rows, resolve/rows.py, is left out, and one read whole for
another consumer goes last, as the cold path orders them). Off under a residency budget (the cold path
then reads a window, not everything) and with ``$ONNX_PREPARED_READ_AHEAD=0``.

A batch's small ranges (at most :data:`SMALL` bytes each: norm weights, rotary tables) are also asked
for at once, when the batch is queued, with ``posix_fadvise(WILLNEED)`` (:func:`advise`): the kernel
queues their reads together instead of one at a time. A hit's first run waits for a 4 KiB norm weight
per layer from the model's data file; read in its turn, each one queued behind the stream's 4 MiB
pieces and the mappings' readahead and took one device round trip under that load (5-11 ms each on a
2-vCPU VM, where an idle 4 KiB read takes 0.1 ms), and the run waited for them layer after layer.
Only small ranges of files the read-ahead does not stream are advised (a file with a range larger than
:data:`SMALL` in this batch or an earlier one is streamed): on a cold start without a companion the
source's data file is streamed in need order, its small ranges come in their turn, and advising them
up front (some 100 norm weights and 128 KiB scales) scattered the device's queue ahead of the stream:
ttfo, cold, 7 processes each interleaved (load ~2.5), read sum 529 -> 302 ms (medium, 16 tokens),
433 -> 303 (128), 337 -> 208 and 350 -> 184 (medium-genai), CPU to the first output 480 -> 385 ms,
658 -> 504 (medium-genai 16); a hit's source norms are still advised.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import os
import threading
from collections.abc import Iterable, Iterator

from onnx_prepared.model.descriptors import ExternalPayload
from onnx_prepared.model.safe_open import FdPool, open_regular
from onnx_prepared.runtime.background import start_thread

READ_AHEAD_ENV = "ONNX_PREPARED_READ_AHEAD"
#: bytes per read call
PIECE = 4 << 20
THREADS = 2
#: ranges of one file closer than this are read as one span
MERGE_GAP = 64 << 10
#: descriptors the read-ahead keeps open at once (a model with one file per tensor opens each in turn)
FD_BOUND = 4
#: ranges of at most this many bytes are asked for at once (posix_fadvise WILLNEED) when queued
SMALL = 256 << 10
#: at most this many small ranges per batch are asked for (one system call each, on the caller's thread)
ADVISE_MAX = 256
_NOWAIT = getattr(os, "RWF_NOWAIT", None)


def read_ahead_threads() -> int:
    """Threads a session streams its first run's bytes with: ``$ONNX_PREPARED_READ_AHEAD`` (0: no
    read-ahead), :data:`THREADS` when unset or not a count."""
    value = os.environ.get(READ_AHEAD_ENV, "").strip()
    return int(value) if value.isdigit() else THREADS


def plan_ranges(plan, manifest) -> list[tuple[str, int, int]]:
    """(file, offset, length) of every external byte range the plan's cold first run reads, in need order
    (each range once; row-only tables left out, row tables read whole for another consumer last)."""
    reqs = plan.requirements
    if plan.resolved.inline_payloads and not any(r.cached for r in reqs):
        return []  # no byte outside the .onnx (a small model: no walk)
    tables = plan.resolved.row_tables
    active = manifest.active
    first: list[tuple[str, int, int]] = []
    late: list[tuple[str, int, int]] = []
    for b in plan.need_order:
        r = reqs[b]
        if r.cached:
            e = r.active.entry
            first.append((e.file, e.offset, e.length))
            continue
        for s in r.sources:
            entry = active.get(s)
            d = entry.descriptor if entry is not None else None
            if d is None or not isinstance(d.payload, ExternalPayload):
                continue
            p = d.payload
            table = tables.get(s) if r.key.is_raw else None
            if table is not None:
                if table.whole_for:
                    late.append((p.file, p.offset, p.length))
                continue
            first.append((p.file, p.offset, p.length))
    return list(dict.fromkeys(first + late))


#: inputs that may be a row table read only by rows (resolve/rows.py), per op: left to the plan's batch
_TABLE_INPUTS = {"Gather": (0,), "GatherBlockQuantized": (0, 2, 3)}


def load_ranges(loaded, covered: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, int, int]]:
    """(file, offset, length) of the loaded model's external initializers in file and offset order, less
    the tables a Gather reads (through Reshapes too): whether a row table is read whole, and then after
    everything else, is the plan's to say (:func:`plan_ranges`). What a cold run without a companion
    reads, known right after the parse; less ``covered`` (the sources a companion hit packed): what a
    hit's first run reads from the source."""
    if not any(type(d.payload) is ExternalPayload for d in loaded.weights.values()):
        return []  # every initializer is inline (a small model: no walk of its nodes)
    facts = loaded.node_facts or [(n.op_type, n.domain, n.name, tuple(n.input), tuple(n.output))
                                  for n in loaded.graph.node]
    made_by = {out: f for f in facts for out in f[4]}
    tables: set[str] = set()
    for f in facts:
        for i in _TABLE_INPUTS.get(f[0], ()):
            name = f[3][i] if i < len(f[3]) else ""
            while name and name not in tables:
                tables.add(name)
                src = made_by.get(name)
                name = src[3][0] if src is not None and src[0] == "Reshape" and src[3] else ""
    out = [(p.file, p.offset, p.length) for name, d in loaded.weights.items()
           if isinstance(p := d.payload, ExternalPayload) and name not in tables and name not in covered]
    return sorted(out)


def index_ranges(index, model_path: str) -> list[tuple[str, int, int]]:
    """(file, offset, length) of a companion index's payloads, read before the source's parse (whose
    digest says whether the companion is this model's): entries of this kernel ABI and format in data
    files that are there, in file and offset order; none for another format version, or when a source
    data file the index records (its stat fingerprint) is not in ``model_path``'s folder as recorded
    (another model's companion, or a changed data file: its entries' source digests are not trusted)."""
    from onnx_prepared.kernels.prepack import KERNEL_ABI
    from onnx_prepared.prepared.cache_format import FORMAT_VERSION

    if index.format_version is not None and index.format_version != FORMAT_VERSION:
        return []
    if not _stamps_there(set(index.source_stamps.values()), os.path.dirname(os.path.abspath(model_path))):
        return []
    es = [e for e in index.entries.values() if e.kernel_abi == KERNEL_ABI and e.format_version == FORMAT_VERSION]
    there = {f for f in {e.file for e in es} if os.path.isfile(f)}
    return sorted((e.file, e.offset, e.length) for e in es if e.file in there)


def _stamps_there(stamps: set[str], folder: str) -> bool:
    """Whether each stat fingerprint (``dev:ino:size:mtime_ns:ctime_ns``, model/safe_open.fingerprint) is
    a file's in ``folder`` (only the files of a recorded inode are stat'ed)."""
    from onnx_prepared.model.safe_open import fingerprint

    if not stamps:
        return True
    inodes = {int(p[1]) for s in stamps if len(p := s.split(":")) == 5 and p[1].isdigit()}
    found = set()
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.inode() in inodes:
                    with contextlib.suppress(OSError):
                        found.add(fingerprint(e.stat(follow_symlinks=False)))
    except OSError:
        return False
    return stamps <= found


def companion_sources(companion) -> set[str]:
    """The source tensors the companion's readable entries (as :func:`companion_ranges`) were packed from."""
    from onnx_prepared.prepared.cache_format import FORMAT_VERSION

    if companion is None or companion.stale_reason is not None:
        return set()
    abi = companion.kernel_abi
    return {s for name, e in companion.entries().items() if e.kernel_abi == abi
            and e.format_version == FORMAT_VERSION and name not in companion.invalid for s in e.lineage}


def companion_ranges(companion) -> list[tuple[str, int, int]]:
    """(file, offset, length) of the companion's payloads a hit may read (entries of this kernel ABI and
    format, not invalid; none when the companion is stale), in file and offset order."""
    from onnx_prepared.prepared.cache_format import FORMAT_VERSION

    if companion is None or companion.stale_reason is not None:
        return []
    abi = companion.kernel_abi
    out = [(e.file, e.offset, e.length) for name, e in companion.entries().items()
           if e.kernel_abi == abi and e.format_version == FORMAT_VERSION and name not in companion.invalid]
    return sorted(out)


def advise(ranges: Iterable[tuple[str, int, int]], small: int = SMALL, limit: int = ADVISE_MAX) -> int:
    """Ask the kernel for the small ranges' pages at once (``posix_fadvise(WILLNEED)``: their reads are
    queued, nothing waits for them); returns how many ranges were asked for. Advice only: a file that
    cannot be opened, or a system without the call, asks nothing (the session's reads still read)."""
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is None:
        return 0
    by_file: dict[str, list[tuple[int, int]]] = {}
    count = 0
    for f, off, n in ranges:
        if 0 < n <= small and count < limit:
            by_file.setdefault(f, []).append((off, n))
            count += 1
    asked = 0
    for f, rs in by_file.items():
        try:
            fd = _open(f)
        except OSError:
            continue
        try:
            for off, n in rs:
                fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
                asked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def spans(ranges: Iterable[tuple[str, int, int]], gap: int = MERGE_GAP) -> list[tuple[str, int, int]]:
    """Consecutive ranges of one file that are adjacent (or within ``gap`` bytes, ascending) merged; not
    across a gap where another range of the list starts (its bytes would be read twice: need order puts
    the rotary tables after the first norm weight that follows them in the file)."""
    ranges = [r for r in ranges if r[2] > 0]
    starts: dict[str, list[int]] = {}
    for f, off, _ in ranges:
        starts.setdefault(f, []).append(off)
    for v in starts.values():
        v.sort()
    out: list[tuple[str, int, int]] = []
    for f, off, n in ranges:
        if out:
            pf, po, pn = out[-1]
            end = po + pn
            if pf == f and end <= off <= end + gap:
                s = starts[f]
                i = bisect.bisect_left(s, end)
                if off == end or not (i < len(s) and s[i] < off):
                    out[-1] = (f, po, off + n - po)
                    continue
        out.append((f, off, n))
    return out


def pieces(span_list: Iterable[tuple[str, int, int]], piece: int = PIECE) -> Iterator[tuple[str, int, int]]:
    """Each span cut into reads of at most ``piece`` bytes, in order."""
    for f, off, n in span_list:
        end = off + n
        while off < end:
            k = min(piece, end - off)
            yield f, off, k
            off += k


class ReadAhead:
    """Threads reading byte ranges (in order, ``piece`` bytes per call) to warm the page cache.

    Ranges come in batches: the constructor's, then :meth:`extend` (each batch in order, after the
    ones before; a range given before is not read again; a batch's small ranges are also asked for at
    once, :func:`advise`); the threads wait for more until a batch is
    marked ``final``, then exit when everything is read. :meth:`stop` makes them finish their current
    piece and exit; :meth:`join` waits for them. An error (a file gone, unreadable) ends the read-ahead
    quietly: the session's own reads report it. Until a piece misses the page cache, a piece whose last
    byte is in it already is skipped (a warm start reads nothing). ``bytes_read`` counts what the threads
    read, ``bytes_skipped`` what they skipped.
    """

    def __init__(self, ranges: Iterable[tuple[str, int, int]], *, final: bool = False, threads: int = THREADS,
                 piece: int = PIECE) -> None:
        self._cond = threading.Condition()
        self._stopped = False
        self._final = False
        self._seen: set[tuple[str, int, int]] = set()
        self._queue: Iterator[tuple[str, int, int]] = iter(())
        self._fds = FdPool(_open, FD_BOUND)
        self._piece = piece
        self.bytes_read = 0
        self.bytes_skipped = 0  # pieces found in the page cache already (their last byte), not read
        self.advised = 0  # small ranges asked for at once (advise)
        self._streamed: set[str] = set()  # files with a range larger than SMALL queued: never advised
        self._probe = _NOWAIT is not None
        self._byte = bytearray(1)
        self._null = self._null_fd = _dev_null()  # _null: None once sendfile failed here
        self.extend(ranges, final=final)
        self.threads = threads
        self._live = threads  # threads not yet past their cleanup (the last one closes the descriptors)
        for _ in range(threads):  # NOTE: not threading.Thread: its start waits for the thread (background.py)
            start_thread(self._work)

    def extend(self, ranges: Iterable[tuple[str, int, int]], *, final: bool = True, front: bool = False) -> None:
        """Read ``ranges`` after everything queued so far (ranges queued before are skipped); ``front``:
        before every piece not yet started, and the small ranges only asked for (:func:`advise`), not
        queued, when all of them could be."""
        new = [r for r in ranges if r not in self._seen]
        self._streamed.update(f for f, _, n in new if n > SMALL)
        queued = new
        if not self._stopped:  # NOTE: not in a file this read-ahead streams (see the module docstring)
            small = [r for r in new if r[0] not in self._streamed and 0 < r[2] <= SMALL]
            asked = advise(small)
            self.advised += asked
            if front and small and asked == len(small):
                queued = [r for r in new if not (r[0] not in self._streamed and 0 < r[2] <= SMALL)]
        with self._cond:
            self._seen.update(new)
            batch = pieces(spans(queued), self._piece)
            self._queue = itertools.chain(batch, self._queue) if front else itertools.chain(self._queue, batch)
            self._final = self._final or final
            self._cond.notify_all()

    def drop(self) -> None:
        """Forget every piece queued and not started (those in flight finish): a batch guessed before
        the parse that the parse proved wrong (a stale companion, runtime/builder.py)."""
        with self._cond:
            self._queue = iter(())

    def _next(self) -> tuple[str, int, int] | None:
        with self._cond:
            while not self._stopped:
                job = next(self._queue, None)
                if job is not None:
                    return job
                if self._final:
                    return None
                self._cond.wait()
            return None

    def _work(self) -> None:
        view: memoryview | None = None  # the preadv buffer, where sendfile cannot be used
        try:
            while (job := self._next()) is not None:
                path, off, n = job
                try:
                    fd = self._fds.acquire(path)
                    try:
                        if self._resident(fd, off + n - 1):
                            with self._cond:
                                self.bytes_skipped += n
                            continue
                        if self._null is None and view is None:
                            view = memoryview(bytearray(self._piece))
                        got = self._read(fd, off, n, view)
                        with self._cond:
                            self.bytes_read += got
                    finally:
                        self._fds.release(fd)
                except OSError:
                    self.stop()
                    return
        finally:
            with self._cond:
                last = self._live == 1
            if last:
                self._fds.close()
                if self._null_fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(self._null_fd)
            with self._cond:
                self._live -= 1
                self._cond.notify_all()

    def _read(self, fd: int, off: int, n: int, view: memoryview | None) -> int:
        """Read ``n`` bytes at ``off`` into the page cache: ``sendfile`` to /dev/null (no copy to user
        space, one call per piece with the GIL released), else ``preadv`` into the thread's buffer."""
        null = self._null
        if null is not None:
            try:
                done = 0
                while done < n:
                    got = os.sendfile(null, fd, off + done, n - done)
                    if got <= 0:
                        break
                    done += got
                return done
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self._null = None  # this filesystem cannot: copy
        return os.preadv(fd, [(view if view is not None else memoryview(bytearray(n)))[:n]], off)

    def _resident(self, fd: int, last: int) -> bool:
        """Whether the byte at ``last`` (a piece's last) is in the page cache: a 1-byte ``preadv`` with
        ``RWF_NOWAIT``, which fails with EAGAIN instead of reading. A warm start then costs a syscall per
        piece, not a copy of every byte. The first miss ends the probing: skipped pieces would not advance
        the kernel's readahead, and a cold file streamed that way read 134 MB in 70-95 ms instead of 60-74
        (2 threads, 6 runs each); where the flag is not supported, every piece is read."""
        if not self._probe:
            return False
        try:
            if os.preadv(fd, [self._byte], last, _NOWAIT) == 1:
                return True
        except OSError:  # EAGAIN: not cached; EOPNOTSUPP / EINVAL: no RWF_NOWAIT here
            pass
        self._probe = False
        return False

    def stop(self) -> None:
        """No piece starts after this (idempotent, thread-safe)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait until every thread has exited (at most ``timeout`` seconds)."""
        with self._cond:
            self._cond.wait_for(lambda: self._live == 0, timeout)

    @property
    def done(self) -> bool:
        """Every thread has exited (and the descriptors are closed)."""
        return self._live == 0


def _dev_null() -> int | None:
    """A write descriptor of /dev/null for ``sendfile`` (None where there is none)."""
    if not hasattr(os, "sendfile"):
        return None
    try:
        return os.open(os.devnull, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _open(path: str) -> int:
    # follow=False: the session resolved and validated these paths at load (a symlink now was swapped in)
    return open_regular(path, follow=False)[0]
