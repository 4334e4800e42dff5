"""On-demand reads of one weight's bytes into a numpy array.

``os.preadv`` (one call per tensor) into a preallocated buffer is the read path. ``benchmarks/read_path.py``
measured it against ``readinto``, ``mmap`` (copy out, and zero-copy views), two parallel preads per
tensor and ``FADV_SEQUENTIAL`` on a 1 GB file in 4-64 MB tensors: cold, preadv was 2-3x faster than
either mmap variant (readahead serves large explicit reads better than page faults) and no parallel or
hinted variant beat it; warm, preadv, readinto and mmap-copy were equal (memcpy-bound). Only a
zero-copy mapping is faster warm, because it moves no byte; it would also turn a file that shrinks
after load into a SIGBUS instead of an :class:`ExternalDataError`, so objects that stay published are
always copies. The exception is a *transient* read (a 4-bit prepack's source, copied into its panels at
once): it is mapped with ``MAP_POPULATE`` (:func:`mapped_sources` says why and what it relies on).
"""

from __future__ import annotations

import errno
import os
import sys
import threading

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ExternalDataError, ModelLoadError, ResourceLimitError, short
from onnx_prepared.model import verified
from onnx_prepared.model.checksum import recorded_sha256
from onnx_prepared.model.descriptors import ExternalPayload, WeightDescriptor, is_packed
from onnx_prepared.model.reader_map import map_readonly
from onnx_prepared.model.safe_open import FdPool, NotRegularFile, fingerprint, open_regular, physical_memory
from onnx_prepared.model.verify import ChecksumVerifier, sha256_chunked
from onnx_prepared.records import replace

_RAM = physical_memory()

#: Bytes ``verify_whole`` reads and hashes at a time (a quarter of ``memory_limit`` if that is less).
STREAM_PIECE = 4 << 20


class ExternalDataReader:
    """Reads descriptors' bytes with ``os.preadv`` through a bounded pool of shared descriptors.

    ``pread`` is position-free, so I/O workers can read concurrently with no lock around the read.
    ``read``/``read_bytes`` are thread-safe; ``close`` closes idle descriptors (a read after ``close``
    reopens its file). ``bytes_read`` counts external-data bytes of completed reads (inline payloads
    are not counted).

    Every (re)open is ``safe_open.open_regular`` (non-blocking, no symlink, regular files only), and at
    most ``fd_bound`` descriptors stay open (LRU), so any number of data files works under a low
    ``ulimit -n``. A tensor larger than ``max_tensor_bytes`` (the session's memory limits) or than
    physical memory raises :class:`ResourceLimitError` before its buffer is allocated.

    A tensor whose external data records a sha256 is verified on its first read from each file
    fingerprint (mismatch: :class:`ExternalDataError`). By default the read hashes its bytes before it
    returns them; with ``defer_verify`` (a session that does not persist what it reads) the hash runs on
    a background thread (``model/verify.py``) and the bytes are returned at once: whoever consumed them
    must call ``check_verified()`` before its result counts, which waits for every verification queued
    so far and raises a mismatch. With ``verified_dir`` what matched is recorded under the data file's
    fingerprint once a ``check_verified()`` passed (in the background: after a session's first run) and
    at ``close()``, and a later reader trusts it while the fingerprint is unchanged
    (``model/verified.py``), so repeated cold starts do not re-hash unchanged weights.
    ``verify_checksums=False`` skips verification (tests, tools). With
    ``hash_reads`` every external read is hashed inline. ``source_digest`` then gives (sha256,
    fingerprint of the file the bytes came from), the pair a companion cache may trust later without
    reading the source.

    >>> with ExternalDataReader() as r:
    ...     w = r.read(loaded.weights["W"])
    """

    def __init__(self, *, max_tensor_bytes: int | None = None, hash_reads: bool = False,
                 verify_checksums: bool = True, defer_verify: bool = False, verified_dir: str | None = None,
                 fd_bound: int | None = None) -> None:
        self._pool = FdPool(_open_data, fd_bound)
        self._lock = threading.Lock()  # guards bytes_read and _digests
        self.bytes_read = 0
        self.max_tensor_bytes = max_tensor_bytes
        self.hash_reads = hash_reads
        self.verify_checksums = verify_checksums
        self.defer_verify = defer_verify
        # Buffers queued for verification stay alive: under a memory limit the backlog is at most a quarter.
        self.verifier = ChecksumVerifier(min(256 << 20, (max_tensor_bytes or 1 << 62) // 4))
        self.stream_piece = min(STREAM_PIECE, self.verifier.max_pending_bytes)  # verify_whole's one buffer
        self._queued: set[tuple[str, int, int, str]] = set()  # (file, offset, length, fp) being verified
        self.verified_dir = verified_dir
        self._records_read: set[tuple[str, str]] = set()  # (file, fp) whose verification record was loaded
        self._records_new: dict[tuple[str, str], dict[tuple[int, int], str]] = {}  # verified, not yet saved
        self._saver: threading.Thread | None = None  # the last background save (check_verified)
        self._save_lock = threading.Lock()
        self._digests: dict[tuple[str, int, int], tuple[str, str]] = {}  # (file, offset, length) -> (sha, fp)
        self._transient: set[tuple[str, int, int]] = set()  # (file, offset, length) read_bytes may map (mark_transient)

    @property
    def open_files(self) -> int:
        """Descriptors currently pooled (at most ``fd_bound``)."""
        return len(self._pool)

    def close(self) -> None:
        """Close every pooled file descriptor, stop background verification and save what this reader
        verified (``verified_dir``). Idempotent."""
        self.verifier.close()
        self._pool.close()
        self.save_records()
        self.wait_records()  # a background save still writing: closed means recorded

    def check_verified(self) -> None:
        """Wait for every checksum verification queued so far; raise :class:`ExternalDataError` if any
        bytes this reader returned did not match their recorded sha256 (on every call from then on).

        What matched since the last save is then recorded (``verified_dir``) on a thread of its own, so
        a process killed without closing (a replica) leaves the records of every run that returned."""
        self.verifier.check()
        if self._records_new and self.verified_dir is not None:  # NOTE: unlocked test: hot runs pass here
            self.save_records(background=True)

    def save_records(self, *, background: bool = False) -> None:
        """Record what this reader verified and has not recorded yet (``verified_dir``; atomic per data
        file, ``verified.save``); ``background`` on a daemon thread (``wait_records`` joins it)."""
        with self._lock:
            new, self._records_new = self._records_new, {}
        if not new or self.verified_dir is None:
            return
        if not background:
            self._save_records(new)
            return
        t = threading.Thread(target=self._save_records, args=(new,), name="onnx-prepared-records", daemon=True)
        self._saver = t
        t.start()

    def wait_records(self) -> None:
        """Wait for the last background save of verification records (tests, tools)."""
        t = self._saver
        if t is not None:
            t.join()

    def _save_records(self, new: dict[tuple[str, str], dict[tuple[int, int], str]]) -> None:
        with self._save_lock:  # one save at a time: each merges with the record on disk
            for (file, fp), ranges in new.items():
                verified.save(self.verified_dir, file, fp, ranges)

    def __enter__(self) -> ExternalDataReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def source_digest(self, desc: WeightDescriptor) -> tuple[str, str] | None:
        """(hex sha256, file fingerprint) of ``desc``'s stored bytes from a read of this reader, or None."""
        p = desc.payload
        if not isinstance(p, ExternalPayload):
            return None
        return self._digests.get((p.file, p.offset, p.length))

    # ---- reads ----

    def read_bytes(self, desc: WeightDescriptor, out: np.ndarray | None = None) -> np.ndarray:
        """The stored bytes of ``desc`` (packed for sub-byte types) as a 1-D uint8 array.

        With ``out`` (a writable C-contiguous uint8 array of at least ``desc.nbytes`` elements) the bytes
        land in ``out`` and ``out[:desc.nbytes]`` is returned. Otherwise external bytes go to a new buffer,
        and an inline tensor's ``raw_data`` comes back as a read-only view (no copy).
        A tensor marked with :meth:`mark_transient` (its reader drops the bytes within moments: a prepack's
        source, copied into its packed layout) may come back without ``out`` as a read-only view of a file
        mapping instead of a copy (:func:`mapped_sources`; ``$ONNX_PREPARED_SOURCE_MMAP=0`` turns it off).
        Raises :class:`ExternalDataError` if the file is gone, shrank, is no longer a regular file, cannot
        be read or does not match its recorded sha256; :class:`ResourceLimitError` if it cannot fit.
        """
        p = desc.payload
        if not isinstance(p, ExternalPayload):
            return _copy_into(_inline_bytes(desc), out)
        mapped = (out is None and p.length >= MAP_MIN_BYTES and (p.file, p.offset, p.length) in self._transient
                  and mapped_sources())
        if out is None and not mapped:
            check_allocation(desc.name, p.length, self.max_tensor_bytes)
        buf = _check_out(out, p.length) if out is not None else None
        fd = self._acquire(desc, p.file)
        try:
            st = os.fstat(fd)
            if p.offset + p.length > st.st_size:
                raise ExternalDataError(f"external data file shrank to {st.st_size} bytes since load; tensor needs "
                                        f"bytes {p.offset}..{p.offset + p.length}", tensor=desc.name, file=p.file)
            if mapped:
                try:
                    buf = _map(fd, p.offset, p.length)
                except (OSError, ValueError):  # a filesystem without mappings: copy
                    check_allocation(desc.name, p.length, self.max_tensor_bytes)
                    mapped = False
            if buf is None:
                buf = np.empty(p.length, dtype=np.uint8)
            mv, got = memoryview(buf), (p.length if mapped else 0)
            while got < p.length:
                n = os.preadv(fd, [mv[got:]], p.offset + got)
                if n == 0:
                    raise ExternalDataError(f"external data file truncated: got {got} of {p.length} bytes "
                                            f"at offset {p.offset}", tensor=desc.name, file=p.file)
                got += n
            want = recorded_sha256(desc) if self.verify_checksums else None
            if want is not None and self.verified_dir is not None:
                self._load_record(p.file, fingerprint(st))
            # Deferred only for bytes nobody persists (hash_reads) into a buffer only we hand out (no out=).
            deferred = (want is not None and self.defer_verify and not self.hash_reads and out is None
                        and self._defer(desc, p, st, buf, want))
            if not deferred and (want is not None or self.hash_reads):
                self._verify(desc, p, fd, st, buf, want)
        except OSError as e:
            raise ExternalDataError(f"cannot read external data: {e.strerror or e}", tensor=desc.name,
                                    file=p.file) from None
        finally:
            self._pool.release(fd)
        with self._lock:
            self.bytes_read += p.length
        return buf

    def read_rows(self, desc: WeightDescriptor, rows: np.ndarray, out: np.ndarray) -> int:
        """Rows ``rows`` (sorted, unique, in range) of ``desc``'s table into ``out`` (a writable
        C-contiguous uint8 array of ``len(rows) * row_bytes`` elements); the table's rows are
        ``desc.payload.length // desc.dims[0]`` bytes each. Returns the number of contiguous runs of rows
        (:func:`row_runs`). Not verified here: the whole tensor's checksum covers the rows (``verify_whole``).

        Scattered rows are gathered from one read-only mapping of their span (:func:`_gather_mapped`),
        not read one run at a time: each ``preadv`` (and ``fstat``) releases the GIL and must take it back,
        and on a cold start the I/O workers and the read-ahead hold it between their calls. Medium
        tiny-llm, 128 tokens, cold, companion hit: 2 x 128 runs of rows took 17-45 ms of wall time for
        2-5 ms of CPU; mapped, 0.2-1 ms of CPU, and the embedding's GatherBlockQuantized ended 26 ms into
        a cold miss's run instead of 69 (medians of 8 fresh processes, load ~4). A mapping relies on what
        :func:`mapped_sources` relies on (a data file truncated in place while the rows are copied would be
        a SIGBUS, not an ExternalDataError; the size is checked first), and ``$ONNX_PREPARED_SOURCE_MMAP=0``
        reads run by run instead. One run is one ``preadv``.
        """
        p = desc.payload
        row_bytes = p.length // desc.dims[0]
        starts, stops = row_runs(rows)
        if (isinstance(p, ExternalPayload) and len(starts) > 1 and mapped_sources()
                and self._gather_rows(desc, p, rows, row_bytes, out)):
            with self._lock:
                self.bytes_read += len(rows) * row_bytes
            return len(starts)
        for a, b in zip(starts, stops):
            part = WeightDescriptor(desc.name, desc.elem_type, (b - a, *desc.dims[1:]),
                                    replace(p, offset=p.offset + int(rows[a]) * row_bytes, length=(b - a) * row_bytes,
                                            checksum=None))
            self.read_bytes(part, out[a * row_bytes: b * row_bytes])
        return len(starts)

    def _gather_rows(self, desc: WeightDescriptor, p: ExternalPayload, rows: np.ndarray, row_bytes: int,
                     out: np.ndarray) -> bool:
        """:meth:`read_rows` through one mapping of the rows' span; False when the file cannot be mapped."""
        first, last = int(rows[0]), int(rows[-1]) + 1
        fd = self._acquire(desc, p.file)
        try:
            size = os.fstat(fd).st_size
            if p.offset + last * row_bytes > size:
                raise ExternalDataError(f"external data file shrank to {size} bytes since load; rows {first}..{last} "
                                        f"need bytes up to {p.offset + last * row_bytes}", tensor=desc.name,
                                        file=p.file)
            try:
                _gather_mapped(fd, p.offset + first * row_bytes, (last - first, row_bytes), rows - first, out)
            except ValueError:  # a filesystem without mappings: read run by run
                return False
            except OSError as e:
                if e.errno in _NO_MAP:
                    return False
                raise
        except OSError as e:
            raise ExternalDataError(f"cannot read external data: {e.strerror or e}", tensor=desc.name,
                                    file=p.file) from None
        finally:
            self._pool.release(fd)
        return True

    def will_need(self, desc: WeightDescriptor, ranges: list[tuple[int, int]]) -> None:
        """Hint that the byte ranges ``(offset, length)`` of ``desc``'s data file are read next
        (``posix_fadvise(WILLNEED)``: the kernel starts reading them all at once, without waiting).

        A row table's rows are scattered: read one after the other while the I/O workers stream
        weights, each cold row read waits its turn in the device queue (16 rows of a tied embedding's
        data and scales: 34 ms of a cold first run before this hint). Hinted first, the row reads wait
        about one latency in all. A hint only: errors are ignored and inline tensors have nothing to hint.
        """
        p = desc.payload
        if not isinstance(p, ExternalPayload) or not ranges or not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = self._pool.acquire(p.file)
        except OSError:
            return  # the read that follows reports it
        try:
            for off, n in ranges:
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            self._pool.release(fd)

    def _acquire(self, desc: WeightDescriptor, file: str) -> int:
        try:
            return self._pool.acquire(file)
        except FileNotFoundError:
            raise ExternalDataError("external data file disappeared since load", tensor=desc.name,
                                    file=file) from None
        except NotRegularFile as e:
            raise ExternalDataError(f"external data file is no longer a regular file (it is a {e.kind})",
                                    tensor=desc.name, file=file) from None
        except OSError as e:
            raise ExternalDataError(f"cannot open external data file: {e.strerror or e}", tensor=desc.name,
                                    file=file) from None

    def _verify(self, desc: WeightDescriptor, p: ExternalPayload, fd: int, st: os.stat_result, buf: np.ndarray,
                want: str | None) -> None:
        """Hash the bytes just read (once per file fingerprint) and compare with the recorded sha256."""
        key, fp = (p.file, p.offset, p.length), fingerprint(st)
        have = self._digests.get(key)
        trusted = False
        if have is not None and have[1] == fp:
            sha = have[0]
        else:
            sha = sha256_chunked(buf)
            if fingerprint(os.fstat(fd)) == fp:  # unchanged while hashed: the pair may be trusted later
                trusted = True
                with self._lock:
                    self._digests[key] = (sha, fp)
        if want is not None and sha != want:
            err = _mismatch(desc, p, sha, want)
            self.verifier.fail(err)  # deferred users of this reader fail too
            raise err
        if want is not None and trusted:
            self._remember(p, fp, sha)

    def _defer(self, desc: WeightDescriptor, p: ExternalPayload, st: os.stat_result, buf: np.ndarray,
               want: str) -> bool:
        """Queue the verification of ``buf`` on the background thread; False: verify inline instead."""
        key, fp = (p.file, p.offset, p.length), fingerprint(st)
        have = self._digests.get(key)
        if have is not None and have[1] == fp:
            if have[0] != want:
                raise _mismatch(desc, p, have[0], want)
            return True  # verified already: nothing to queue
        with self._lock:
            if (*key, fp) in self._queued:
                return True  # a verification of these very bytes is queued: check_verified covers it
            self._queued.add((*key, fp))

        def job() -> ExternalDataError | None:
            try:
                sha = sha256_chunked(buf, lambda: self.verifier.closed)
                if sha is None:
                    return None  # reader closed: nobody will consume a result
                with self._lock:  # NOTE: fingerprint as read: a later change is a new key, never trusted
                    self._digests[key] = (sha, fp)
                if sha != want:
                    return _mismatch(desc, p, sha, want)
                self._remember(p, fp, sha)
                return None
            finally:
                with self._lock:
                    self._queued.discard((*key, fp))

        if self.verifier.submit(job, p.length):
            return True
        with self._lock:
            self._queued.discard((*key, fp))
        return False

    def verify_whole(self, desc: WeightDescriptor) -> None:
        """Verify ``desc``'s recorded sha256 over its whole stored bytes without keeping them: queued on
        the verification thread, which reads and hashes ``stream_piece`` bytes at a time (one buffer).

        For tensors read only in parts (row tables, ``resolve/rows.py``): the checksum covers the whole
        tensor, so the parts are verified only by this. The semantics are those of a deferred read: a
        run that used the parts waits for it in ``check_verified()`` and raises a mismatch, as does
        every later one. Nothing happens when the tensor records no sha256, is verified already (this
        reader, or a verification record under the file's current fingerprint) or is being verified.
        """
        p = desc.payload
        want = recorded_sha256(desc) if self.verify_checksums else None
        if want is None or not isinstance(p, ExternalPayload):
            return
        fd = self._acquire(desc, p.file)
        try:
            fp = fingerprint(os.fstat(fd))
        except OSError as e:
            raise ExternalDataError(f"cannot read external data: {e.strerror or e}", tensor=desc.name,
                                    file=p.file) from None
        finally:
            self._pool.release(fd)
        if self.verified_dir is not None:
            self._load_record(p.file, fp)
        key = (p.file, p.offset, p.length)
        with self._lock:
            have = self._digests.get(key)
            if have is not None and have[1] == fp:
                if have[0] != want:
                    self.verifier.fail(_mismatch(desc, p, have[0], want))
                return
            if (*key, fp) in self._queued:
                return
            self._queued.add((*key, fp))
        piece = max(1, min(self.stream_piece, p.length))

        def job() -> ExternalDataError | None:
            try:
                sha = self._stream_sha256(desc, piece)
                if sha is None:
                    return None  # reader closed: nobody will consume a result
                with self._lock:
                    self._digests[key] = (sha, fp)
                if sha != want:
                    return _mismatch(desc, p, sha, want)
                self._remember(p, fp, sha)
                return None
            except ExternalDataError as e:  # gone, shrank, unreadable: the parts cannot be trusted
                return e
            finally:
                with self._lock:
                    self._queued.discard((*key, fp))

        # nbytes 0: queued, it holds no buffer; running, one piece (the backlog bound is for held buffers)
        if not self.verifier.submit(job, 0):
            with self._lock:
                self._queued.discard((*key, fp))

    def _stream_sha256(self, desc: WeightDescriptor, piece: int) -> str | None:
        """sha256 of ``desc``'s stored bytes read ``piece`` bytes at a time into one reused buffer."""
        import hashlib  # OpenSSL loads with the first hash, not with the package

        p = desc.payload
        h, buf = hashlib.sha256(), np.empty(piece, np.uint8)
        for off in range(0, p.length, piece):
            if self.verifier.closed:
                return None
            n = min(piece, p.length - off)
            part = replace(p, offset=p.offset + off, length=n, checksum=None)
            self.read_bytes(replace(desc, payload=part), buf)  # NOTE: only name and payload are read
            h.update(memoryview(buf)[:n])
        return h.hexdigest()

    def _load_record(self, file: str, fp: str) -> None:
        """Trust what an earlier process verified in ``file`` under fingerprint ``fp`` (model/verified.py)."""
        if (file, fp) in self._records_read:
            return
        ranges = verified.load(self.verified_dir, file, fp)
        with self._lock:
            self._records_read.add((file, fp))
            for (off, n), sha in ranges.items():
                self._digests.setdefault((file, off, n), (sha, fp))

    def _remember(self, p: ExternalPayload, fp: str, sha: str) -> None:
        if self.verified_dir is not None:
            with self._lock:
                self._records_new.setdefault((p.file, fp), {})[(p.offset, p.length)] = sha

    def mark_transient(self, descs: list[WeightDescriptor]) -> None:
        """Reads of these tensors' stored bytes are transient from now on (see :meth:`read_bytes`): the
        session marks the sources only a copying prepack reads (``runtime/state.py``)."""
        with self._lock:
            self._transient.update((d.payload.file, d.payload.offset, d.payload.length) for d in descs
                                   if isinstance(d.payload, ExternalPayload))

    def read(self, desc: WeightDescriptor) -> np.ndarray:
        """The value of ``desc`` as a read-only numpy array of its logical dtype and shape.

        Same dtype, shape and values as ``onnx.numpy_helper.to_array`` on the fully loaded tensor
        (ml_dtypes types for bfloat16, float8 and the unpacked sub-byte types). A tensor marked with
        :meth:`mark_transient` may come back as a view of a file mapping.
        """
        if isinstance(desc.payload, ExternalPayload):
            arr = decode(desc, self.read_bytes(desc))
        else:
            arr = _inline_array(desc)
        arr.flags.writeable = False
        return arr


#: errno values of ``mmap`` meaning "this file cannot be mapped" (rows are then read run by run)
_NO_MAP = frozenset({errno.ENODEV, errno.EACCES, errno.EINVAL, errno.ENOMEM, errno.EPERM})
#: transient reads at least this long are mapped (a mapping costs two syscalls and a VMA)
MAP_MIN_BYTES = 256 << 10
MAP_ENV = "ONNX_PREPARED_SOURCE_MMAP"


def mapped_sources() -> bool:
    """Whether transient reads map the file instead of copying it (``$ONNX_PREPARED_SOURCE_MMAP=0``: no).

    A prepack reads its source once and writes a layout of its own, so the copy a read makes is pure
    cost on the cold path: a mapping with ``MAP_POPULATE`` has the kernel read ahead and map the pages
    in one call, and the source is never copied into anonymous memory (medium tiny-llm, cold, 16 tokens,
    6 fresh processes at load ~6: process CPU 324 -> 284 ms, system time 91 -> 61 ms, last read 404 ->
    299 ms after spawn). What it relies on: the data file is not truncated in place while a prepack
    reads it (that would be a SIGBUS, not an ExternalDataError); the mapping is dropped with the source
    once its prepack has copied it, and objects published as read (raw) are always copied.
    """
    import mmap

    return os.environ.get(MAP_ENV, "1") != "0" and hasattr(mmap, "MAP_POPULATE")


def _map(fd: int, offset: int, length: int) -> np.ndarray:
    """A read-only view of ``length`` bytes at ``offset`` of ``fd``, mapped and populated (no descriptor
    kept: model/reader_map.py)."""
    import mmap

    base = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    return map_readonly(fd, base, offset + length - base)[offset - base: offset - base + length]


def row_runs(rows: np.ndarray) -> tuple[list[int], list[int]]:
    """[start, stop) positions in ``rows`` (sorted, unique row numbers) of each contiguous run of them."""
    if not len(rows):
        return [], []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    return np.concatenate(([0], breaks)).tolist(), np.concatenate((breaks, [len(rows)])).tolist()


def _gather_mapped(fd: int, offset: int, shape: tuple[int, int], index: np.ndarray, out: np.ndarray) -> None:
    """``out`` <- rows ``index`` of the ``shape`` (rows, row bytes) table at ``offset`` of ``fd``, copied
    out of a read-only mapping of it (one ``mmap``, one copy with the GIL released, one ``munmap``)."""
    import mmap

    base = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    m = map_readonly(fd, base, offset + shape[0] * shape[1] - base, populate=False)
    src = m[offset - base: offset - base + shape[0] * shape[1]].reshape(shape)
    np.take(src, index, axis=0, out=out.reshape(len(index), shape[1]))
    del src, m  # the last references: unmapped here


def _mismatch(desc: WeightDescriptor, p: ExternalPayload, sha: str, want: str) -> ExternalDataError:
    return ExternalDataError(f"external data checksum mismatch: bytes {p.offset}..{p.offset + p.length} hash to "
                             f"sha256 {sha[:16]}..., the model records {want[:16]}... (the data file changed or "
                             f"is corrupt)", tensor=desc.name, file=p.file)


def decode(desc: WeightDescriptor, raw: np.ndarray) -> np.ndarray:
    """Stored little-endian bytes -> the logical array (a view of ``raw`` unless the type is packed)."""
    if is_packed(desc.elem_type):
        # Sub-byte types: onnx owns the unpacking convention; give it an in-memory tensor.
        t = onnx.TensorProto(name=desc.name, data_type=desc.elem_type, dims=desc.dims, raw_data=raw.tobytes())
        return onnx.to_array(t)
    arr = raw.view(desc.dtype).reshape(desc.dims)
    if sys.byteorder == "big" and desc.dtype.itemsize > 1:  # NOTE: untested here; ONNX bytes are little-endian
        arr = arr.byteswap()
    return arr


# ---- helpers ---------------------------------------------------------------------------------------


def _open_data(file: str) -> int:
    # follow=False: load resolved symlinks to a real path, so a symlink here was swapped in since load.
    return open_regular(file, follow=False)[0]


def check_allocation(what: str, nbytes: int, limit: int | None = None) -> None:
    """Raise ResourceLimitError naming ``what`` if ``nbytes`` exceed ``limit`` or physical memory."""
    if limit is not None and nbytes > limit:
        raise ResourceLimitError(f"{short(what)!r} needs {nbytes} bytes, more than the memory limit of {limit} "
                                 f"bytes")
    ram = _RAM
    if ram is not None and nbytes > ram:
        raise ResourceLimitError(f"{short(what)!r} needs {nbytes} bytes, more than this machine's {ram} bytes "
                                 f"of physical memory")


def _check_out(out: np.ndarray, n: int) -> np.ndarray:
    if out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable 1-D C-contiguous uint8 array, got {out.dtype} {out.shape}")
    if out.size < n:
        raise ValueError(f"out holds {out.size} bytes, the tensor needs {n}")
    return out[:n]


def _copy_into(data: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return data
    buf = _check_out(out, data.size)
    buf[...] = data
    return buf


def _inline_array(desc: WeightDescriptor) -> np.ndarray:
    try:
        return onnx.to_array(desc.payload.tensor)
    except Exception as e:  # numpy/onnx raise assorted types for malformed typed fields
        raise ModelLoadError(f"cannot decode inline tensor {desc.name!r} ({desc.dims}): {e}") from None


def _inline_bytes(desc: WeightDescriptor) -> np.ndarray:
    """Stored bytes of an inline tensor: ``raw_data`` as is, or typed fields re-encoded the way raw_data would be."""
    t = desc.payload.tensor
    if t.data_type == onnx.TensorProto.STRING:
        raise ValueError(f"tensor {desc.name!r} is STRING: it has no fixed-size stored bytes")
    if t.HasField("raw_data"):
        return np.frombuffer(t.raw_data, dtype=np.uint8)
    raw = onnx.numpy_helper.from_array(_inline_array(desc)).raw_data
    return np.frombuffer(raw, dtype=np.uint8)
