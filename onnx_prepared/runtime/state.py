"""PreparedExecutionState: everything mutable about one session's prepared execution.

The plan is immutable and shared; this object owns the prepared-object store (the one generation
record per key, and the shared source reads), the arenas and the payload reader, and holds the session
task bodies. Per-invocation state lives in :class:`~onnx_prepared.runtime.frame.ExecutionFrame`.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from onnx_prepared.memory import Arenas
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan, TaskDescriptor, TaskKind
from onnx_prepared.prepared import EntryState, PreparedObjectStore, ReadEntry
from onnx_prepared.records import field, record
from onnx_prepared.resolve import ManifestReader, PreparedKey
from onnx_prepared.resolve.keys import lineage_digest
from onnx_prepared.resolve.resolver import source_checksum

#: layouts whose prepack copies every source byte (kernels/_q4_panels.pack_q4): their sources may be mapped
TRANSIENT_LAYOUTS = ("matmul-nbits-q4-panel16",)


class PreparedExecutionState:
    """Session-scoped mutable state. Thread-safe through the store's lock (counters only grow)."""

    def __init__(self, plan: PreparedExecutionPlan, arenas: Arenas, reader: ManifestReader,
                 companion: Any = None) -> None:
        # Two stores, two jobs: ``store`` is this session's in-memory PreparedObjectStore (generation
        # records); ``companion`` the companion-model cache on disk (a PreparedModelStore, or None).
        self.companion = companion
        self.plan = plan
        self.arenas = arenas
        self.reader = reader
        self.store = PreparedObjectStore(r.key for r in plan.requirements)
        self._record_digests = companion is not None and companion.writable  # build_if_missing
        self.counters: Counter[str] = Counter()  # "read:<name>", "prepack:<key>"
        # largest activation peak a completed run measured (ExecutionFrame.step): what a hot run
        # reserves in the ExecutionArena (0: none yet, the hot run steps and measures it)
        self.execution_peak = 0
        self._invocation_ids = itertools.count(1)
        # Sources only 4-bit MatMulNBits prepacks read (they copy every byte into their panel layout):
        # read without a copy of their own (a file mapping: ExternalDataReader.mark_transient).
        # Anything published as read, or packed by another rule (which may keep views), is copied.
        if any(r.key.layout.startswith(TRANSIENT_LAYOUTS) for r in plan.requirements):  # (no walk without one)
            packed_only: dict[str, bool] = {}
            for r in plan.requirements:
                ok = not r.key.is_raw and r.key.layout.startswith(TRANSIENT_LAYOUTS)
                for name in r.sources:
                    packed_only[name] = packed_only.get(name, True) and ok
            active = reader.manifest.active
            reader.reader.mark_transient([active[n].descriptor for n, ok in packed_only.items()
                                          if ok and n in active and active[n].descriptor is not None])

    def next_invocation_id(self) -> int:
        return next(self._invocation_ids)

    def note_execution_peak(self, nbytes: int) -> None:
        """A run finished with this activation peak (a benign race: the max only grows)."""
        if nbytes > self.execution_peak:
            self.execution_peak = nbytes

    # ---- session task bodies (scheduler-agnostic; the sequential reference path calls them too) ----
    def attach_read(self, name: str) -> tuple[ReadEntry, bool]:
        """Attach one production to the current read of ``name``: (entry, caller_must_schedule_read)."""
        return self.store.attach_read(name)

    def read_source(self, name: str, entry: ReadEntry) -> None:
        """Read one payload into its shared read entry (publish_raw / prepack consume it)."""
        value = self.reader.read(name)
        self.counters[f"read:{name}"] += 1
        if self._record_digests:
            self._record_digest(name, value)
        nbytes = int(getattr(value, "nbytes", 0))
        self.store.fill_read(entry, value, self.arenas.preparation.acquire(nbytes, f"source {name}"))

    def read_inline(self, name: str) -> ReadEntry:
        """Read a small inline payload for the one task consuming it (``TaskDescriptor.self_reads``): a
        private entry, not shared and held by no arena (the consumer drops it when it returns)."""
        value = self.reader.read(name)
        self.counters[f"read:{name}"] += 1
        if self._record_digests:
            self._record_digest(name, value)
        return ReadEntry(name, value=value)

    def publish_raw(self, key: PreparedKey, generation: int, entry: ReadEntry) -> None:
        """Publish a source read as is (a raw prepared object); the read may be shared with a prepack."""
        value = entry.value
        nbytes = int(getattr(value, "nbytes", 0))
        alloc = self.arenas.prepared.acquire(nbytes, str(key))
        self.store.publish(key, generation, value, nbytes, alloc)

    def prepack(self, key: PreparedKey, generation: int, entries: list[ReadEntry]) -> None:
        """Pack the sources of ``key`` and publish the result."""
        req = self.plan.resolved.requirement(key)
        self.store.mark_preparing(key, generation)
        packed = req.spec.pack(*[e.value for e in entries])
        self.counters[f"prepack:{key}"] += 1
        nbytes = int(getattr(packed, "nbytes", 0))
        alloc = self.arenas.prepared.acquire(nbytes, str(key))
        self.store.publish(key, generation, packed, nbytes, alloc)

    def _record_digest(self, name: str, value: np.ndarray) -> None:
        """Sidecar digest of every source read, so the next process can trust it without reading it.

        External tensors: the (sha256, data file fingerprint) pair the reader computed on this read (a
        session with a writable companion reads with ``hash_reads``); inline ones: hashed here.
        """
        entry = self.reader.manifest.active.get(name) or self.reader.manifest.dormant.get(name)
        desc = entry.descriptor if entry is not None else None
        if desc is not None and desc.is_external:
            pair = self.reader.reader.source_digest(desc)
            if pair is not None:
                self.companion.record_source_digest(name, pair[0], stamp=pair[1])
            return
        import hashlib

        buf = np.ascontiguousarray(value).view(np.uint8) if value.dtype != object else None
        if buf is not None:
            self.companion.record_source_digest(name, hashlib.sha256(buf.data).hexdigest())

    def read_packed(self, key: PreparedKey, generation: int) -> None:
        """Companion hit: read the packed payload and publish it (falls back to the source if corrupt)."""
        from onnx_prepared.errors import CacheError

        req = self.plan.resolved.requirement(key)
        try:
            raw = self.reader.read_packed(key.slot_name, self.companion)
        except CacheError:
            # NOTE: a corrupt entry is ignored, never trusted: rebuild from the dormant source recipe.
            self.counters[f"cache_corrupt:{key}"] += 1
            if self.companion.writable:
                self.reader.reader.hash_reads = True  # the rebuilt object is persisted: verify its sources inline
            entries = []
            for s in req.sources:
                e = ReadEntry(s, users=1)
                self.reader.allow_fallback(s)
                self.read_source(s, e)
                entries.append(e)
            try:
                self.prepack(key, generation, entries)
            finally:
                self.detach_reads(entries)
            self._republish(key)
            return
        self.counters[f"read_packed:{key}"] += 1
        packed = req.spec.from_bytes(raw)
        nbytes = int(getattr(packed, "nbytes", raw.nbytes))
        alloc = self.arenas.prepared.acquire(nbytes, str(key))
        self.store.publish(key, generation, packed, nbytes, alloc)

    def _republish(self, key: PreparedKey) -> None:
        """A corrupt companion entry was rebuilt: replace it on disk in this session (a later
        require_complete session must not find the hole). Best effort: a failed write is a miss next time."""
        companion = self.companion
        if companion is None or not companion.writable:
            return
        from onnx_prepared.errors import CacheError

        try:
            if self.persist(key) is not None:
                companion.flush()
                self.counters[f"cache_republished:{key}"] += 1
        except CacheError:
            pass

    def persist(self, key: PreparedKey) -> PreparedKey | None:
        """Queue the resident packed object's bytes for the companion model; the key with its digest."""
        companion = self.companion
        req = self.plan.resolved.requirement(key)
        if self.store.state(key) is not EntryState.RESIDENT:
            return None
        digest = key.lineage_digest
        if digest is None:  # computed from sidecar digests recorded by this session's reads
            manifest = self.reader.manifest
            ds = [manifest.active[s].descriptor for s in req.sources]
            digest = lineage_digest([source_checksum(d, companion.source_digest_of) for d in ds], req.sources,
                                    [f"{d.elem_type}:{list(d.dims)}" for d in ds])
            if digest is None:
                return None
        packed = self.store.get(key)
        dkey = PreparedKey(key.lineage, key.layout, key.device, digest)
        companion.put(dkey, req.spec.to_bytes(packed))
        self.counters[f"persist:{key}"] += 1
        return dkey

    def prepare_sequential(self, requirements: list) -> None:
        """The spec's sequential reference path: the same session tasks, one at a time, in this order.

        Each requirement's generation runs the plan's descriptors (``plan.generation_tasks``) through
        :data:`BODIES`, as the scheduler does: a companion hit its read_packed, a miss its read_source
        (once per source, even when two layouts share it) and prepack / publish_raw. Persisting stays
        with the parallel path's background tasks.
        """
        work = []
        for r in requirements:  # claim and attach first, so a source shared by two objects is read once
            gen, produce = self.store.claim(r.key)
            if produce:
                inst = SessionTaskInstances(r.key, gen)
                descriptors = self.plan.generation_tasks(r.key)
                for d in descriptors:
                    if d.kind is TaskKind.READ_SOURCE:
                        inst.reads[d.sources[0]] = self.attach_read(d.sources[0])[0]
                work.append((inst, descriptors))
        try:
            for inst, descriptors in work:
                try:
                    for d in descriptors:
                        if d.kind is TaskKind.READ_SOURCE and inst.reads[d.sources[0]].value is not None:
                            continue  # a source shared with an object prepared earlier: already read
                        BODIES[d.kind](self, d, inst)
                except BaseException as e:
                    self.store.fail(inst.key, inst.generation, e)
                    raise
        finally:
            for inst, _ in work:
                self.store.abandon(inst.key, inst.generation)  # no-op for published or failed generations
                self.detach_reads(list(inst.reads.values()))

    def detach_reads(self, entries: list[ReadEntry]) -> None:
        """A production is finished with its reads (success, failure or cancel)."""
        self.store.detach_reads(entries)


@record(eq=False)
class SessionTaskInstances:
    """One generation of one prepared object: the shared reads its session tasks consume."""

    key: PreparedKey
    generation: int
    reads: dict[str, ReadEntry] = field(default_factory=dict)  # source name -> its (shared) read


def _read_source(st: PreparedExecutionState, d: TaskDescriptor, inst: SessionTaskInstances) -> None:
    st.read_source(d.sources[0], inst.reads[d.sources[0]])


def _publish_raw(st: PreparedExecutionState, d: TaskDescriptor, inst: SessionTaskInstances) -> None:
    s = d.sources[0]
    st.publish_raw(inst.key, inst.generation, st.read_inline(s) if d.self_reads else inst.reads[s])


def _prepack(st: PreparedExecutionState, d: TaskDescriptor, inst: SessionTaskInstances) -> None:
    own, reads = d.self_reads, inst.reads
    st.prepack(inst.key, inst.generation, [st.read_inline(s) if s in own else reads[s] for s in d.sources])


def _read_packed(st: PreparedExecutionState, d: TaskDescriptor, inst: SessionTaskInstances) -> None:
    st.read_packed(inst.key, inst.generation)


def _persist(st: PreparedExecutionState, d: TaskDescriptor, inst: SessionTaskInstances) -> PreparedKey | None:
    return st.persist(inst.key)


#: The body of every session task, by the kind of its descriptor: what the scheduler's tasks and the
#: sequential path call (``BODIES[d.kind](state, d, instances)``).
BODIES: dict[TaskKind, Callable[[PreparedExecutionState, TaskDescriptor, SessionTaskInstances], Any]] = {
    TaskKind.READ_SOURCE: _read_source,
    TaskKind.PUBLISH_RAW: _publish_raw,
    TaskKind.PREPACK: _prepack,
    TaskKind.READ_PACKED: _read_packed,
    TaskKind.PERSIST: _persist,
}


class PrefetchWindow:
    """How many requirements ahead of a run to prefetch under a residency budget.

    Shared by a session's concurrent runs, so it changes only under its lock: it doubles when a run
    had to wait (I/O slower than compute) and halves when residency refuses a prefetch.
    """

    def __init__(self, size: int, cap: int) -> None:
        self._lock = threading.Lock()
        self.cap = max(1, cap)
        self.size = min(size, self.cap)

    def grow(self) -> None:
        with self._lock:
            self.size = min(self.size * 2, self.cap)

    def shrink(self) -> None:
        with self._lock:
            self.size = max(1, self.size // 2)
