"""``verify`` (reads every payload and its identity record) and ``info`` (metadata only) over a companion."""

from __future__ import annotations

import os
from collections import Counter

from onnx_prepared.errors import CacheError
from onnx_prepared.prepared import cache_io as io
from onnx_prepared.prepared.cache_format import ABI_KEY, ALIGNMENT, FORMAT_VERSION, ID_SIZE, identity_problem


def verify(path: str | os.PathLike, *, source_digest: str | None = None) -> list[str]:
    """Check every entry's metadata, file and checksum (reads every payload); [] when the cache is sound.

    ``source_digest`` also checks that the companion belongs to that source model.
    """
    path = os.path.abspath(os.fspath(path))
    try:
        m, _ = io.read_index(path)
    except CacheError as e:
        return [str(e)]
    if m is None:
        return [f"{path}: no companion prepared model"]
    problems = [f"{path}: entry {n!r}: {msg}" if n else f"{path}: {msg}" for n, msg in m.problems]
    if m.format_version not in (None, FORMAT_VERSION):
        return [*problems, f"{path}: format version {m.format_version!r} is not {FORMAT_VERSION!r}: not checked"]
    if source_digest is not None and m.source_model_digest != source_digest:
        problems.append(f"{path}: belongs to source model {m.source_model_digest!r}, not {source_digest!r}")
    fds, invalid = io.open_files(m.entries.values())
    try:
        for name, e in sorted(m.entries.items()):
            if name in invalid:
                problems.append(f"{path}: entry {name!r}: {invalid[name]}")
                continue
            if e.offset % ALIGNMENT:
                problems.append(f"{path}: entry {name!r}: offset {e.offset} is not {ALIGNMENT}-byte aligned")
            sha, got = io.checksum_range(fds[e.file], e.offset, e.length)
            record = os.pread(fds[e.file], ID_SIZE, e.offset + e.length)
            if got != e.length:
                problems.append(f"{path}: entry {name!r}: payload truncated ({got} of {e.length} bytes)")
            elif sha != e.checksum:
                problems.append(f"{path}: entry {name!r}: checksum mismatch in {e.location} (corrupt payload)")
            elif (why := identity_problem(record, e)) is not None:
                problems.append(f"{path}: entry {name!r}: {why} in {e.location}")
    finally:
        io.close_all(fds)
    return problems


def info(path: str | os.PathLike) -> dict:
    """Summary of a companion (metadata and file sizes only): entries, bytes, layouts, ABI, devices, digests."""
    path = os.path.abspath(os.fspath(path))
    m, _ = io.read_index(path)
    if m is None:
        raise CacheError(f"no companion prepared model at {path!r}")
    entries = sorted(m.entries.values(), key=lambda e: e.key_name)
    files = sorted({e.location for e in entries})
    return {
        "path": path,
        "format_version": m.format_version,
        "source_model_digest": m.source_model_digest,
        "kernel_abi": m.meta.get(ABI_KEY),
        "generation": m.generation,
        "entries": len(entries),
        "total_bytes": sum(e.length for e in entries),
        "layouts": dict(Counter(e.layout for e in entries)),
        "devices": dict(Counter(e.device for e in entries)),
        "kernel_abis": dict(Counter(e.kernel_abi for e in entries)),
        "format_versions": dict(Counter(e.format_version for e in entries)),
        "data_files": {f: _size(os.path.join(os.path.dirname(m.path), f)) for f in files},
        "source_digests": len(m.source_digests),
        "problems": [f"{n}: {msg}" if n else msg for n, msg in m.problems],
        "entry_list": [
            {"name": e.key_name, "layout": e.layout, "device": e.device, "bytes": e.length, "file": e.location,
             "offset": e.offset, "kernel_abi": e.kernel_abi}
            for e in entries
        ],
    }


def _size(file: str) -> int | None:
    try:
        return os.stat(file).st_size
    except OSError:
        return None

