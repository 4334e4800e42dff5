"""PreparedModelStore: the companion prepared ONNX model as a persisted cache of packed weights.

On disk (folder of the companion ``<root>.onnx``; ``default_prepared_path`` picks a per-user folder
keyed by the source model's identity)::

    <root>.onnx               the companion index: a ModelProto with one UINT8 initializer per entry (cache_format)
    <root>.<16 hex>.data      payload files, one per generation written; payloads 4096-byte aligned
    <root>.lock               flock-ed: shared while opening, exclusive while publishing (unless locking
                              is off: ``locking=False``, ``$ONNX_PREPARED_CACHE_LOCKING=0``, or a filesystem
                              whose flock fails; cache_io says what then holds)
    .<root>.<16 hex>.*.tmp    files of a write in progress (or of a writer that died)

Opening reads only the companion index (never a payload byte) and opens each referenced data file once, so
a concurrent writer that deletes an old generation cannot take payloads away from this store.

Corruption rules (spec: "Structural corruption is an error; ordinary incompatibility is a miss"):

* **CacheError at open**, naming the file and entry: a companion index that does not parse, lacks the
  format/source-digest metadata, or has an entry with missing metadata keys, a non-UINT8/1-D tensor,
  a non-hex checksum, a name that disagrees with its metadata, a duplicate name, or a location that
  escapes the folder. A broken companion index was written by no correct writer: silently rebuilding would
  hide the bug or the attack.
* **Invalid entry** (``store.invalid[name] = reason``; a miss, and replaced by the next build): its
  payload file is missing, not a regular file, or shorter than offset + length. Files are separate
  from the companion index, so one lost or truncated file must not take every other entry with it.
* **CacheError at read**: ``read_payload`` finds fewer bytes or a different checksum (a bit flip). The
  entry is then marked invalid too, so the caller's rebuild replaces it at the next flush.
* **Miss** (whole companion ignored, ``store.stale_reason``): another container format version or
  another source model digest; under ``build_if_missing`` the next flush replaces it.
* **Miss** (per entry, ``explain_miss``): no entry, other lineage or lineage digest (stale), layout,
  device, kernel ABI or packed-format version. The caller turns a miss into an error under
  ``require_complete`` (``require``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
import warnings
from collections.abc import Mapping

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import CacheError, CacheWarning
from onnx_prepared.kernels.prepack import KERNEL_ABI
from onnx_prepared.memory.aligned import aligned_empty
from onnx_prepared.model.descriptors import ExternalPayload, WeightDescriptor
from onnx_prepared.model.safe_open import read_regular
from onnx_prepared.options import PreparedModelPolicy  # its one home: the option's values
from onnx_prepared.prepared import cache_gc, payload_hash
from onnx_prepared.prepared import cache_io as io
from onnx_prepared.prepared.cache_check import info, verify
from onnx_prepared.prepared.cache_format import (
    ABI_KEY,
    FORMAT_VERSION,
    GENERATION_KEY,
    ID_SIZE,
    SOURCE_MODEL_KEY,
    CacheEntry,
    CompanionIndex,
    encode,
    entry_name,
    identity_problem,
    identity_record,
    is_sha256,
    superseded,
)
from onnx_prepared.resolve.keys import PreparedKey

__all__ = [
    "FORMAT_VERSION",
    "CacheEntry",
    "PreparedModelPolicy",
    "PreparedModelStore",
    "collect_garbage",
    "default_prepared_path",
    "info",
    "source_model_digest",
    "verify",
]


def source_model_digest(model_path: str | os.PathLike, model: onnx.ModelProto | None = None) -> str:
    """Identity of the portable model: sha256 of its ``.onnx`` protobuf with weight checksums removed.

    The identity partitions lookup; correctness comes from each entry's lineage digest. It therefore
    covers the graph, metadata and tensor descriptions but not the content checksums of the weights:
    changing one weight makes only the entries derived from it miss, not the whole companion. It never
    includes a path or a timestamp of this machine, so a copied model keeps its identity. ``model``
    (already parsed metadata-only) saves a second parse, and the digest of the last ``model`` given is
    remembered (a serving replica names its companion by it, then the session opens it: 3-16 ms each).
    Loaded models are never mutated; a changed size is still recomputed.
    """
    global _LAST_DIGEST
    if model is None:
        return _model_digest(_parse_model(model_path))
    last, size = _LAST_DIGEST, model.ByteSize()
    if last is not None and last[0] is model and last[1] == size:
        return last[2]
    digest = _model_digest(model)
    _LAST_DIGEST = (model, size, digest)
    return digest


#: (model, its ByteSize, digest) of the last model passed to ``source_model_digest``.
_LAST_DIGEST: tuple[onnx.ModelProto, int, str] | None = None


def _model_digest(model: onnx.ModelProto) -> str:
    data = model.SerializeToString(deterministic=True)
    if b"checksum" not in data:  # no external-data entry to strip: the digest of the model as it is
        # (reading every initializer's entries to find none was ~0.75 of ~2.2 ms on the medium tiny-llm)
        return hashlib.sha256(data).hexdigest()
    # the stripped digest is a pure function of these bytes: remembered per process under their sha256
    # (every session of a model parses a new ModelProto; stripping the entries was ~2.5 of ~2.9 ms)
    key = hashlib.sha256(data).digest()
    hit = _STRIPPED_DIGESTS.get(key)
    if hit is not None:
        return hit
    digest = _stripped_digest(model)
    if len(_STRIPPED_DIGESTS) >= 64:
        _STRIPPED_DIGESTS.clear()
    _STRIPPED_DIGESTS[key] = digest
    return digest


#: sha256 of a model's deterministic serialization -> its digest with checksum entries stripped
_STRIPPED_DIGESTS: dict[bytes, str] = {}


def _stripped_digest(model: onnx.ModelProto) -> str:
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for t in stripped.graph.initializer:
        keep = [e for e in t.external_data if e.key != "checksum"]
        if len(keep) != len(t.external_data):
            del t.external_data[:]
            t.external_data.extend(keep)
    return hashlib.sha256(stripped.SerializeToString(deterministic=True)).hexdigest()


def _parse_model(model_path: str | os.PathLike) -> onnx.ModelProto:
    try:
        data, _ = read_regular(os.fspath(model_path))
    except OSError as e:
        raise CacheError(f"cannot read model {os.fspath(model_path)!r} to compute its digest: "
                         f"{e.strerror or e}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:
        raise CacheError(f"cannot parse model {os.fspath(model_path)!r} to compute its digest: {e}") from None
    return model


def default_prepared_path(model_path: str | os.PathLike, *, digest: str | None = None,
                          model: onnx.ModelProto | None = None) -> str:
    """``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/onnx-prepared/prepared/<partition>/<stem>.prepared.onnx``.

    ``partition`` is ``digest[:16]`` for a model without external data, else the first 16 hex digits of
    sha256 over the digest and the real paths of its data files: two folders holding byte-identical
    ``.onnx`` files with different data files get different companions (each would otherwise keep
    replacing the other's entries). A path only partitions; it is never identity. Pass ``digest``
    (``source_model_digest``) and ``model`` (the parsed protobuf) when already at hand.
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    stem = os.path.splitext(os.path.basename(os.fspath(model_path)))[0]
    if model is None:
        model = _parse_model(model_path)
    digest = digest or source_model_digest(model_path, model)
    folder = os.path.dirname(os.path.abspath(os.fspath(model_path)))
    files = sorted({os.path.realpath(os.path.join(folder, e.value))
                    for t in model.graph.initializer for e in t.external_data if e.key == "location"})
    partition = digest[:16]
    if files:
        partition = hashlib.sha256("\n".join([digest, *files]).encode()).hexdigest()[:16]
    return os.path.join(base, "onnx-prepared", "prepared", partition, f"{stem}.prepared.onnx")


def _root(path: str) -> str:
    name = os.path.basename(path)
    return name[: -len(".onnx")] if name.endswith(".onnx") and len(name) > 5 else name


class PreparedModelStore:
    """The companion cache of one source model. Every public method is thread-safe.

    >>> store = PreparedModelStore(path, source_digest=source_model_digest("m.onnx"),
    ...                            policy=PreparedModelPolicy.BUILD_IF_MISSING)
    >>> entry = store.lookup(key)                 # metadata only
    >>> raw = store.read_payload(entry) if entry else None
    >>> store.put(key, packed_bytes); store.flush()
    """

    def __init__(self, path: str | os.PathLike, *, source_digest: str, policy: PreparedModelPolicy | str,
                 kernel_abi: str = KERNEL_ABI, locking: bool | None = None,
                 index: tuple[CompanionIndex, int] | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.folder = os.path.dirname(self.path)
        self.root = _root(self.path)
        self.source_digest = source_digest
        self.policy = PreparedModelPolicy(getattr(policy, "value", policy))
        self.kernel_abi = kernel_abi
        self.locking = io.locking_from_env() if locking is None else bool(locking)  # False: no flock at all
        self._map = io.mapping_from_env()
        self.bytes_read = 0
        self.generation = 0
        self.invalid: dict[str, str] = {}  # entry name -> reason; such entries always miss
        self.stale_reason: str | None = None  # set when the whole companion on disk is ignored
        self._entries: dict[str, CacheEntry] = {}  # replaced whole (never mutated), so readers need no lock
        self._digests: dict[str, str] = {}
        self._stamps: dict[str, str] = {}
        self._bound: dict[str, str | None] = {}  # source name -> data file fingerprint at load (bind_sources)
        self._verified: set[tuple] = set()  # payload identities that matched their checksum in this store
        self._hashed: dict[str, set[tuple[int, int]]] = {}  # data file -> (offset, length) hashed by this store
        self._per_file: dict[str, int] = {}  # data file -> live entries in it (counted on first need)
        self._fds: dict[str, int] = {}  # data file -> fd, open until close() (a reader may still use it)
        self._queue: dict[str, tuple[PreparedKey, np.ndarray]] = {}
        self._queued_digests: dict[str, tuple[str, str | None]] = {}
        self._lock = threading.Lock()  # guards everything above that changes after __init__
        self._flush_lock = threading.Lock()  # one flush at a time per store
        self._closed = False
        self.degraded: str | None = None  # why writes stopped (the folder is read-only), if they did
        if self.policy is not PreparedModelPolicy.DISABLED:
            self._load(index)
        if self.policy is PreparedModelPolicy.BUILD_IF_MISSING:
            self._probe_writable()

    # ---- open ----
    def _load(self, index: tuple[CompanionIndex, int] | None = None) -> None:
        """Open the companion: its index (``index``: the (index, inode) read before, without the lock, used
        if the file is still that inode: an index is replaced whole, by rename) and its data files."""
        lock_fd = self._open_lock(create=False)
        try:
            for _ in range(8):  # without a lock file, retry if a writer replaced the companion index meanwhile
                with io.flocked(lock_fd, exclusive=False):
                    if index is not None and io.inode(self.path) == index[1]:
                        m, ino = index
                    else:
                        m, ino = io.read_index(self.path)
                    index = None
                    if m is None:
                        return
                    self.stale_reason = _stale_reason(m, self.source_digest)
                    if self.stale_reason is not None:
                        return
                    _raise_problems(m)
                    fds, invalid = io.open_files(m.entries.values())
                    if lock_fd is not None or io.inode(self.path) == ino:
                        break
                    io.close_all(fds)
            else:
                raise CacheError(f"companion prepared model {self.path!r} keeps changing while it is opened")
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._entries, self._fds, self.invalid = m.entries, fds, invalid
        self._digests, self._stamps, self.generation = dict(m.source_digests), dict(m.source_stamps), m.generation

    def _probe_writable(self) -> None:
        """Degrade to read-only now when the folder cannot be written (creating the folder and the lock
        file a flush needs anyway), so that the session's plan schedules no persist that never runs.
        Other errors are left to the flush, which reports them as before."""
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd = self._open_lock(create=True)
        except OSError as e:
            if e.errno in _READ_ONLY_ERRNOS:
                self._degrade(e)
            return
        if fd is not None:
            os.close(fd)

    @property
    def _lock_path(self) -> str:
        return os.path.join(self.folder, f"{self.root}.lock")

    def _open_lock(self, *, create: bool) -> int | None:
        """The lock file's fd, or None: no lock file yet (read side), or locking is off. The first lock
        file that does not flock turns locking off for this store, with one CacheWarning."""
        if not self.locking:
            return None
        fd = io.open_lock(self._lock_path, create=create)
        if fd is not None and not io.flock_works(fd):
            os.close(fd)
            self.locking = False
            warnings.warn(f"the folder of companion prepared model {self.path!r} does not support flock: continuing "
                          f"without locks (atomic renames only; see docs/serving.md)", CacheWarning, stacklevel=4)
            return None
        return fd

    # ---- lookup ----
    def entries(self) -> dict[str, CacheEntry]:
        """Every entry of the companion index, compatible or not (name -> entry)."""
        return dict(self._entries)

    def lookup(self, key: PreparedKey) -> CacheEntry | None:
        """The compatible entry for ``key``, or None (a miss). Metadata only; reads no payload."""
        return self._match(key)[0]

    def explain_miss(self, key: PreparedKey) -> str | None:
        """Why ``lookup(key)`` misses (None on a hit), for logs and ``require_complete`` errors."""
        return self._match(key)[1]

    def require(self, key: PreparedKey) -> CacheEntry:
        """``lookup`` that raises CacheError naming the companion and the reason on a miss (require_complete)."""
        entry, why = self._match(key)
        if entry is None:
            raise CacheError(f"companion prepared model {self.path!r} has no compatible entry for "
                             f"{entry_name(key.lineage, key.layout, key.device)!r}: {why}")
        return entry

    def _match(self, key: PreparedKey) -> tuple[CacheEntry | None, str | None]:
        if self.policy is PreparedModelPolicy.DISABLED:
            return None, "the prepared model policy is disabled"
        if self.stale_reason is not None:
            return None, self.stale_reason
        name = entry_name(tuple(key.lineage), key.layout, key.device)
        e = self._entries.get(name)
        if e is None:
            return None, "no entry (never built)"
        why = self.invalid.get(name)
        if why is not None:
            return None, f"entry invalid: {why}"
        if key.lineage_digest is None:
            return None, "the source lineage digest is unknown (sources carry no checksum): entry unverifiable"
        for what, have, want in (
            ("source lineage", e.lineage, tuple(key.lineage)),
            ("source lineage digest (stale: sources changed)", e.lineage_digest, key.lineage_digest),
            ("layout", e.layout, key.layout),
            ("device", e.device, key.device),
            ("kernel ABI", e.kernel_abi, self.kernel_abi),
            ("packed format version", e.format_version, FORMAT_VERSION),
        ):
            if have != want:
                return None, f"{what} differs: cached {have!r}, needed {want!r}"
        return e, None

    # ---- payloads ----
    @property
    def mapping(self) -> bool:
        """Whether payloads are read as file mappings (``read_payload``): on, unless turned off by
        ``$ONNX_PREPARED_CACHE_MMAP=0``, or by running without locks (a network filesystem, where another
        host deleting a data file would end a mapping with SIGBUS where a read fails cleanly)."""
        return self._map and self.locking

    def read_payload(self, entry: CacheEntry, out: np.ndarray | None = None) -> np.ndarray:
        """The payload of ``entry`` as a 1-D uint8 array (into ``out[:length]`` when given).

        Verifies length, the identity record (the payload names this entry's lineage digest, layout and
        device: every read) and the XXH3-128 checksum; a mismatch raises CacheError and marks the entry
        invalid. The checksum is computed while the payload is read (chunk by chunk, GIL released), on
        the first read of an entry in this process only: a payload that matched is remembered by its data
        file's fingerprint (``payload_hash.payload_identity``, from ``fstat`` of the descriptor read), so a
        second session, or an evicted object restored once per token, does not hash it again, while a
        rewritten or replaced data file (another fingerprint) is hashed again. Without locks (a network
        filesystem, where timestamps come from another host's clock) the memo is this store's only.

        Without ``out`` the payload is a read-only view of a populated file mapping (``mapping``; no
        copy, no fresh buffer to fault in: ``cache_io.map_payload`` says why), hashed whole once mapped.
        """
        try:
            fd = self._fd(entry)
            st = os.fstat(fd)
        except OSError as e:
            raise self._corrupt(entry, f"cannot read payload: {e.strerror or e}") from None
        ident = payload_hash.payload_identity(st, entry.offset, entry.length, entry.checksum)
        if out is None and self.mapping:
            buf = self._read_mapped(entry, fd, ident, st)
            if buf is not None:
                return buf
        if out is not None:
            if out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous or not out.flags.writeable:
                raise ValueError(f"out must be a writable 1-D C-contiguous uint8 array, got {out.dtype} {out.shape}")
            if out.size < entry.length:
                raise ValueError(f"out holds {out.size} bytes, entry {entry.key_name!r} needs {entry.length}")
            buf = out[: entry.length]
        else:
            buf = aligned_empty(entry.length)
        record = bytearray(ID_SIZE)
        hasher = payload_hash.hasher() if not self._was_verified(ident, entry) else None
        try:
            got = io.pread_into(fd, buf, entry.offset, record, hasher=hasher)  # payload, then its identity
        except OSError as e:
            raise self._corrupt(entry, f"cannot read payload: {e.strerror or e}") from None
        if got != entry.length + ID_SIZE:
            raise self._corrupt(entry, f"payload truncated: {got} of {entry.length} + {ID_SIZE} bytes at offset "
                                       f"{entry.offset}")
        why = identity_problem(record, entry)
        if why is not None:
            raise self._corrupt(entry, why)
        self._check_sum(entry, ident, st, hasher)
        return buf

    def _read_mapped(self, entry: CacheEntry, fd: int, ident: tuple, st: os.stat_result) -> np.ndarray | None:
        """``read_payload`` through a file mapping; None when this file cannot be mapped (copy it)."""
        try:
            mapped = io.map_payload(fd, entry.offset, entry.length + ID_SIZE)
        except OSError as e:
            if e.errno in _NO_MAPPING:
                return None
            raise self._corrupt(entry, f"cannot read payload: {e.strerror or e}") from None
        if mapped is None:
            size = os.fstat(fd).st_size
            raise self._corrupt(entry, f"payload truncated: {max(0, size - entry.offset)} of {entry.length} + "
                                       f"{ID_SIZE} bytes at offset {entry.offset}")
        mm, at = mapped
        with memoryview(mm) as view:
            why = identity_problem(view[at + entry.length: at + entry.length + ID_SIZE], entry)
            if why is not None:
                raise self._corrupt(entry, why)
            hasher = None
            if not self._was_verified(ident, entry):
                hasher = payload_hash.hasher()
                hasher.update(view[at: at + entry.length])
        self._check_sum(entry, ident, st, hasher)
        return np.frombuffer(mm, np.uint8, entry.length, at)

    def _was_verified(self, ident: tuple, entry: CacheEntry) -> bool:
        """Verified by this store, this process, or (with locks: timestamps from this host's clock) an
        earlier process whose verification record of the data file still matches its fingerprint."""
        if ident in self._verified:
            return True
        return self.locking and (payload_hash.verified_in_process(ident)
                                 or payload_hash.verified_on_disk(entry.file, ident))

    def _check_sum(self, entry: CacheEntry, ident: tuple, st: os.stat_result, hasher) -> None:
        """Compare a payload's hash (None: verified earlier in this process) and count its bytes."""
        if hasher is not None:
            if hasher.hexdigest() != entry.checksum:
                raise self._corrupt(entry, f"payload checksum mismatch (corrupt bytes; {payload_hash.ALGORITHM})")
            with self._lock:
                self._verified.add(ident)
                done = self._hashed.setdefault(entry.file, set())
                done.add((entry.offset, entry.length))
                whole = len(done) >= self._entries_in(entry.file)
            if self.locking and payload_hash.remember_verified(ident, st):
                payload_hash.queue_record(entry.file, ident)
                if whole:  # every entry of that file hashed: record it now (a replica may never close)
                    payload_hash.save_records([entry.file])
        with self._lock:
            self.bytes_read += entry.length

    def _entries_in(self, file: str) -> int:
        """How many live entries lie in data file ``file`` (call under ``_lock``)."""
        n = self._per_file.get(file)
        if n is None:
            n = self._per_file[file] = sum(1 for e in self._entries.values() if e.file == file)
        return n

    def _fd(self, entry: CacheEntry) -> int:
        fd = self._fds.get(entry.file)
        if fd is not None:
            return fd
        with self._lock:
            if self._closed:
                raise OSError("store is closed")
            fd = self._fds.get(entry.file)
            if fd is None:
                fd, _, why = io.open_payload_file(entry.file)
                if fd is None:
                    raise OSError(why)
                self._fds[entry.file] = fd
        return fd

    def _corrupt(self, entry: CacheEntry, why: str) -> CacheError:
        with self._lock:
            if self._entries.get(entry.key_name) == entry:
                self.invalid[entry.key_name] = why
        return CacheError(f"corrupt prepared-cache entry {entry.key_name!r} in {self.path!r} "
                          f"(file {entry.file!r}): {why}")

    # ---- building ----
    @property
    def writable(self) -> bool:
        return self.policy is PreparedModelPolicy.BUILD_IF_MISSING

    def put(self, key: PreparedKey, payload: np.ndarray) -> None:
        """Queue ``key``'s packed bytes for the next ``flush`` (no I/O here).

        A no-op unless the policy is build_if_missing and ``key.lineage_digest`` is known, or when a
        compatible entry already exists. The store keeps a reference to ``payload`` (a copy only if it
        is not contiguous): do not mutate it afterwards (prepared objects are immutable).
        """
        if not self.writable or key.lineage_digest is None or self.lookup(key) is not None:
            return
        arr = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
        with self._lock:
            self._queue[entry_name(tuple(key.lineage), key.layout, key.device)] = (key, arr)

    @property
    def pending(self) -> int:
        """Entries queued by ``put`` and not yet flushed."""
        return len(self._queue)

    def bind_sources(self, weights: Mapping[str, WeightDescriptor]) -> None:
        """The sources of this session's model, with the stat fingerprint of each external tensor's data
        file at load (a tensor inside the ``.onnx`` has none: the source model digest covers its bytes).

        A recorded digest of a bound external source is trusted only while its recorded stamp equals
        this fingerprint (``source_digest_of``): a rewritten, replaced or copied data file makes it a miss.
        """
        bound = {n: d.payload.fingerprint if isinstance(d.payload, ExternalPayload) else None
                 for n, d in weights.items()}
        with self._lock:
            self._bound = bound

    def record_source_digest(self, name: str, sha256: str, *, stamp: str | None = None) -> None:
        """Remember a source tensor's content digest (computed on a read); persisted at flush.

        ``stamp`` is the stat fingerprint of the data file the hashed bytes came from (None for inline
        tensors). It only detects change: a later lookup under another fingerprint distrusts the digest.
        It is never identity.
        """
        sha256 = sha256.lower().removeprefix("sha256:")
        if not is_sha256(sha256):
            raise ValueError(f"source digest of {name!r} is not a hex sha256: {sha256!r}")
        with self._lock:
            if self._digests.get(name) == sha256 and self._stamps.get(name) == stamp:
                return
            self._digests[name] = sha256
            if stamp is None:
                self._stamps.pop(name, None)
            else:
                self._stamps[name] = stamp
            if self.writable:
                self._queued_digests[name] = (sha256, stamp)

    def source_digest_of(self, name: str, *, stamp: str | None = None) -> str | None:
        """The recorded digest of source ``name``, or None if unknown or not trustworthy now: its recorded
        stamp must equal ``stamp`` (default: the fingerprint ``bind_sources`` gave for ``name``)."""
        d = self._digests.get(name)
        if d is None:
            return None
        want = stamp if stamp is not None else self._bound.get(name)
        if want is not None and self._stamps.get(name) != want:
            return None
        return d

    @property
    def source_digests(self) -> dict[str, str]:
        return dict(self._digests)

    def flush(self) -> int:
        """Persist queued payloads and digests as one new generation; returns the entries written.

        Merges with the companion index on disk under the inter-process lock, so concurrent builders all
        contribute. No-op (0) unless build_if_missing. On failure the queue is kept for a retry.
        """
        if not self.writable:
            return 0
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return 0
                queue, self._queue = self._queue, {}
                digests, self._queued_digests = self._queued_digests, {}
            if not queue and not digests:
                return 0
            try:
                self._write_generation(queue, digests)
            except OSError as e:
                if e.errno in _READ_ONLY_ERRNOS:
                    self._degrade(e)
                    return 0
                with self._lock:
                    self._queue = {**queue, **self._queue}
                    self._queued_digests = {**digests, **self._queued_digests}
                raise CacheError(f"cannot write companion prepared model {self.path!r}: {e.strerror or e} "
                                 f"(the queued entries are kept for a retry)") from None
            except BaseException:
                with self._lock:
                    self._queue = {**queue, **self._queue}
                    self._queued_digests = {**digests, **self._queued_digests}
                raise
            return len(queue)

    def _degrade(self, e: OSError) -> None:
        """The cache folder cannot be written: continue read-only (hits still work), warn once."""
        with self._lock:
            self.policy = PreparedModelPolicy.READ_ONLY
            self.degraded = f"{e.strerror or e}"
            self._queue.clear()
            self._queued_digests.clear()
        warnings.warn(f"companion prepared model {self.path!r} cannot be written ({e.strerror or e}): continuing "
                      f"read-only, prepared objects are rebuilt in memory", CacheWarning, stacklevel=3)

    def gc(self) -> list[str]:
        """Remove this cache's superseded data files and dead writers' temporary files now; names removed.

        Flush does the same after each publication; this is for folders left by crashed or stopped
        writers. Safe against a concurrent writer: it runs under the exclusive cache lock, and a live
        writer's temporary data file is flock-ed (skipped). A companion index with structural problems is not
        garbage-collected (CacheError): its references cannot be trusted.
        """
        return collect_garbage(self.path, locking=self.locking)

    def _write_generation(self, queue: dict[str, tuple[PreparedKey, np.ndarray]],
                          digests: dict[str, tuple[str, str | None]]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        lock_fd = self._open_lock(create=True)
        tmp = tmp_fd = None
        try:
            gen_id = io.new_id()
            new: dict[str, CacheEntry] = {}
            if queue:
                with io.flocked(lock_fd, exclusive=False):  # a cleaner must not see it before it is flock-ed
                    tmp, tmp_fd = io.create_temp_data(self.folder, self.root, gen_id, lock=self.locking)
                names = list(queue)
                ids = [identity_record(n, k.lineage_digest, k.layout, k.device) for n in names for k in [queue[n][0]]]
                records = io.write_payloads(tmp_fd, [(queue[n][1], r) for n, r in zip(names, ids)])
                location = f"{self.root}.{gen_id}.data"
                file = os.path.join(self.folder, location)
                for n, (off, length, sha) in zip(names, records):
                    k = queue[n][0]
                    new[n] = CacheEntry(n, tuple(k.lineage), k.lineage_digest, k.layout, k.device, self.kernel_abi,
                                        FORMAT_VERSION, file, off, length, sha, location)
                io.checkpoint("data_written")
            with io.flocked(lock_fd, exclusive=True):
                io.checkpoint("locked")
                if tmp is not None:
                    os.rename(tmp, os.path.join(self.folder, f"{self.root}.{gen_id}.data"))
                    tmp = None
                    io.fsync_dir(self.folder)
                    io.checkpoint("data_published")
                # Without locks another writer may replace the index between our read and our rename (we
                # then merge again) or right after it (then our entries are gone: merge again until the index
                # holds them). Bounded: an entry still lost is a miss, never a corrupt one.
                for _ in range(1 if self.locking else 1 + _LOCKLESS_REPUBLISH):
                    if self._publish(new, digests) and (self.locking or self._published(new)):
                        break
        finally:
            if tmp_fd is not None:
                os.close(tmp_fd)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if lock_fd is not None:
                os.close(lock_fd)

    def _published(self, new: dict[str, CacheEntry]) -> bool:
        """Whether the index on disk holds an entry of the same lineage for each of ``new``."""
        disk, _ = io.read_index(self.path)
        if disk is None:
            return not new
        have = {**disk.superseded, **disk.entries}  # an older-version entry of ours is dropped, not lost
        return all(n in have and have[n].lineage_digest == e.lineage_digest for n, e in new.items())

    def _publish(self, new: dict[str, CacheEntry], digests: dict[str, tuple[str, str | None]]) -> bool:
        """Merge ``new`` into the companion index on disk and replace it; True. Caller holds the exclusive
        lock; without locks, False when another writer replaced the index meanwhile (nothing changed)."""
        disk, ino = io.read_index(self.path)
        kept: dict[str, CacheEntry] = {}
        src, stamps, gen = {}, {}, 0
        if disk is not None and _stale_reason(disk, self.source_digest) is None:
            _raise_problems(disk)
            src, stamps, gen = dict(disk.source_digests), dict(disk.source_stamps), disk.generation
            with self._lock:
                known_bad = {n for n in self.invalid if self._entries.get(n) == disk.entries.get(n)}
            kept = {n: e for n, e in disk.entries.items() if n not in new and n not in known_bad}
        for n, (d, s) in digests.items():
            src[n] = d
            if s is None:
                stamps.pop(n, None)
            else:
                stamps[n] = s
        fds, invalid = io.open_files(list(kept.values()) + list(new.values()))
        merged = {n: e for n, e in {**kept, **new}.items() if n not in invalid}  # lost files: dropped
        for n in superseded(merged.values()):  # a layout version bump's first build drops the old layout
            del merged[n]
        meta = {SOURCE_MODEL_KEY: self.source_digest, ABI_KEY: self.kernel_abi, GENERATION_KEY: str(gen + 1)}
        model = encode(meta, list(merged.values()), src, stamps)
        unchanged = None if self.locking else (lambda: io.inode(self.path) == ino)
        try:
            replaced = io.write_atomic(self.path, model.SerializeToString(), self.root, unchanged=unchanged)
        except BaseException:
            io.close_all(fds)
            raise
        if not replaced:
            io.close_all(fds)
            return False
        io.checkpoint("manifest_replaced")
        io.cleanup(self.folder, self.root, {e.location for e in merged.values()},
                   min_age=0.0 if self.locking else io.LOCKLESS_GRACE_S)
        with self._lock:
            for f, fd in fds.items():
                if f in self._fds:
                    os.close(fd)
                else:
                    self._fds[f] = fd
            self.invalid = {n: r for n, r in self.invalid.items() if n in merged and merged[n] == self._entries.get(n)}
            self._entries = merged
            self._per_file = {}
            for n, d in src.items():  # a digest recorded since the snapshot is newer than the disk's
                if n not in self._queued_digests:
                    self._digests[n] = d
                    if n in stamps:
                        self._stamps[n] = stamps[n]
            self.stale_reason = None
            self.generation = gen + 1
        return True

    # ---- lifetime ----
    def close(self) -> None:
        """Close payload files; queued puts not flushed are dropped. Idempotent."""
        with self._lock:
            self._closed = True
            fds, self._fds = list(self._fds.values()), {}
            hashed = list(self._hashed)
            self._queue.clear()
            self._queued_digests.clear()
        for fd in fds:
            os.close(fd)
        if self.locking:
            payload_hash.save_records(hashed)  # what was hashed but not yet recorded (a partial read)

    def __enter__(self) -> PreparedModelStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PreparedModelStore({self.path!r}, policy={self.policy.value}, entries={len(self._entries)}, "
                f"invalid={len(self.invalid)}, pending={len(self._queue)}, generation={self.generation})")


# ---- helpers ---------------------------------------------------------------------------------------

#: errno values of ``mmap`` meaning "this file cannot be mapped": the payload is copied instead.
_NO_MAPPING = frozenset({errno.ENODEV, errno.EACCES, errno.EINVAL, errno.ENOMEM, errno.EPERM})

#: errno values meaning "this folder cannot be written here": the store degrades to read-only.
_READ_ONLY_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


#: Without locks, how many times a writer merges again when a concurrent publication dropped its entries.
_LOCKLESS_REPUBLISH = 8


def collect_garbage(path: str | os.PathLike, *, locking: bool | None = None,
                    dropped: list[str] | None = None) -> list[str]:
    """``cache gc``: compact the companion, then delete its unreferenced data files and dead writers'
    temporary files; returns the file names removed (``dropped``, when given, receives the names of the
    entries compaction dropped).

    Compaction (``cache_gc``) drops entries of a superseded layout version and entries whose payload
    file is gone, and copies the live payloads out of data files that are mostly dead bytes, as one new
    generation published atomically.

    Without locks (``locking=False``, ``$ONNX_PREPARED_CACHE_LOCKING=0``, or a filesystem whose flock
    fails) only files older than ``cache_io.LOCKLESS_GRACE_S`` go: a younger one may be a live writer's.
    """
    path = os.path.abspath(os.fspath(path))
    folder, root = os.path.dirname(path), _root(path)
    lock_fd = None
    if io.locking_from_env() if locking is None else locking:
        try:
            lock_fd = io.open_lock(os.path.join(folder, f"{root}.lock"), create=True)
        except OSError as e:
            raise CacheError(f"cannot lock companion prepared model {path!r} for gc: {e.strerror or e}") from None
        if not io.flock_works(lock_fd):
            os.close(lock_fd)
            lock_fd = None
    try:
        with io.flocked(lock_fd, exclusive=True):
            m, ino = io.read_index(path)
            if m is not None:
                _raise_problems(m)
                if m.format_version == FORMAT_VERSION:
                    gone = cache_gc.compact(path, root, m, ino, locking=lock_fd is not None)
                    if dropped is not None:
                        dropped.extend(gone)
            referenced = set() if m is None else {e.location for e in m.entries.values()}
            return io.cleanup(folder, root, referenced, min_age=0.0 if lock_fd is not None else io.LOCKLESS_GRACE_S)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)



def _stale_reason(m: CompanionIndex, source_digest: str) -> str | None:
    if m.format_version is not None and m.format_version != FORMAT_VERSION:
        return f"companion format version {m.format_version!r} is not {FORMAT_VERSION!r}"
    if m.source_model_digest is not None and m.source_model_digest != source_digest:
        return f"companion belongs to another source model (digest {m.source_model_digest[:16]}...)"
    return None


def _raise_problems(m: CompanionIndex) -> None:
    if m.problems:
        name, msg = m.problems[0]
        where = f" entry {name!r}:" if name else ""
        more = f" (and {len(m.problems) - 1} more problems; run `onnx-prepared cache verify`)" if len(
            m.problems) > 1 else ""
        raise CacheError(f"corrupt companion prepared model {m.path!r}:{where} {msg}{more}")

