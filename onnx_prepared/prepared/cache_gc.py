"""Compaction for ``cache gc``: drop superseded entries from the companion index, copy the live payloads
out of data files that are mostly dead bytes, and publish the result as one new generation.

Stale bytes arise two ways. A layout version bump (``cache_format.superseded``) leaves the old-layout
entries behind; readers already skip them and the next publication drops them from the index, so a data
file that only they reference is deleted by that publication's cleanup. A data file that also holds live
entries (a generation mixing, say, Gemm weights still current with MatMulNBits panels of the old layout)
stays referenced: gc copies its live payloads into a new data file (each payload read back, its identity
record and XXH3 checksum checked, so a corrupt payload is dropped rather than copied) and replaces the
index atomically. Readers that opened the old generation keep their descriptors (payload files are never
modified, an unlinked file stays readable), so gc needs no reader to stop.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from onnx_prepared.prepared import cache_io as io
from onnx_prepared.prepared import payload_hash
from onnx_prepared.prepared.cache_format import (
    ALIGNMENT,
    GENERATION_KEY,
    ID_SIZE,
    CacheEntry,
    CompanionIndex,
    encode,
    identity_problem,
)

#: A data file is rewritten by gc when at least this fraction of its bytes belongs to no live entry.
COMPACT_DEAD_FRACTION = 0.25


def _footprint(e: CacheEntry) -> int:
    return -(-(e.length + ID_SIZE) // ALIGNMENT) * ALIGNMENT


def files_to_compact(m: CompanionIndex) -> set[str]:
    """Data files (absolute) holding live entries whose dead bytes reach ``COMPACT_DEAD_FRACTION``."""
    live: dict[str, int] = {}
    for e in m.entries.values():
        live[e.file] = live.get(e.file, 0) + _footprint(e)
    out = set()
    for file, used in live.items():
        try:
            size = os.stat(file).st_size
        except OSError:
            continue  # a missing file's entries are invalid: the rewrite drops them
        if size and (size - used) >= COMPACT_DEAD_FRACTION * size:
            out.add(file)
    return out


def compact(path: str, root: str, m: CompanionIndex, ino: int | None, *, locking: bool) -> list[str]:
    """Rewrite the companion at ``path`` (index ``m``, read under the caller's exclusive lock, or with
    inode ``ino`` when locking is off) without superseded entries and with mostly-dead data files copied;
    returns the names of the entries dropped (superseded, missing or corrupt). No-op ([]) when there is
    nothing to drop or copy."""
    folder = os.path.dirname(path)
    copy = files_to_compact(m)
    fds, invalid = io.open_files(m.entries.values())
    try:
        if not m.superseded and not copy and not invalid:
            return []
        dropped = sorted(m.superseded) + sorted(invalid)
        kept = {n: e for n, e in m.entries.items() if n not in invalid and e.file not in copy}
        moving = [e for e in m.entries.values() if e.file in copy and e.key_name not in invalid]
        tmp = tmp_fd = None
        try:
            if moving:
                gen_id = io.new_id()
                tmp, tmp_fd = io.create_temp_data(folder, root, gen_id, lock=locking)
                good: list[CacheEntry] = []

                def payloads():
                    for e in moving:
                        buf = np.empty(e.length, dtype=np.uint8)
                        record = bytearray(ID_SIZE)
                        h = payload_hash.hasher()
                        got = io.pread_into(fds[e.file], buf, e.offset, record, hasher=h)
                        if (got != e.length + ID_SIZE or identity_problem(record, e) is not None
                                or h.hexdigest() != e.checksum):
                            dropped.append(e.key_name)
                            continue
                        good.append(e)
                        yield buf, bytes(record)

                records = io.write_payloads(tmp_fd, payloads())
                location = f"{root}.{gen_id}.data"
                file = os.path.join(folder, location)
                for e, (off, length, sha) in zip(good, records):
                    kept[e.key_name] = CacheEntry(e.key_name, e.lineage, e.lineage_digest, e.layout, e.device,
                                                  e.kernel_abi, e.format_version, file, off, length, sha, location)
                os.rename(tmp, file)
                tmp = None
                io.fsync_dir(folder)
            meta = dict(m.meta)
            meta[GENERATION_KEY] = str(m.generation + 1)
            model = encode(meta, list(kept.values()), m.source_digests, m.source_stamps)
            unchanged = None if locking else (lambda: io.inode(path) == ino)
            if not io.write_atomic(path, model.SerializeToString(), root, unchanged=unchanged):
                return []  # another writer published meanwhile (no locks): its cleanup or the next gc
        finally:
            if tmp_fd is not None:
                os.close(tmp_fd)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        m.entries = kept
        m.superseded = {}
        return dropped
    finally:
        io.close_all(fds)
