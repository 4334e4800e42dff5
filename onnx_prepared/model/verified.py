"""Verification records: which tensors of a data file matched their model checksum, under which stat
fingerprint, so a later process need not hash them again.

The trust rule is the companion's (docs/reliability.md): a digest is trusted only while the data file
keeps the fingerprint (device, inode, size, mtime_ns, ctime_ns) it had when those bytes were hashed.
A record therefore says "bytes offset..offset+length of this file, under fingerprint F, hash to S"; a
reader trusts it only when the file's fingerprint is F now and S equals the checksum the model records.
A rewrite (even one that restores mtime) changes ctime, so the record is ignored and the bytes are
hashed again. Without records every process re-hashes every weight (sha256, ~0.5 ms per MB here).
File timestamps come from a coarse clock (a few ms), so a file rewritten in place within one tick of
being hashed could keep its fingerprint: a file changed less than ``RACY_S`` seconds before the save is
not recorded (the next process hashes it and records it then), as git treats "racily clean" entries.

One ``marshal`` file per data file in ``$XDG_CACHE_HOME/onnx-prepared/verified`` (or ``~/.cache/...``),
named by a CRC of the data file's real path (:mod:`~onnx_prepared.model.cache_files`; the record names
the file it is about), written atomically. Not JSON and not a sha256 name:
a cold run reads the records on its I/O threads, where importing ``json`` and OpenSSL's ``hashlib`` held
the GIL for milliseconds while the first layers computed (a record that trusts every range needs no hash).
The companion's data files get records of the same form, their payloads' XXH3-128 checksums
(prepared/payload_hash.py). Records are a cache: an unreadable, corrupt or foreign record is ignored,
a folder that cannot be written is skipped silently, and at most ``MAX_RECORDS`` files are kept (oldest removed first).
"""

from __future__ import annotations

import contextlib
import os

from onnx_prepared.model import cache_files
from onnx_prepared.model.safe_open import changed_within, fingerprint, read_regular

MAX_RECORDS = 256
#: A data file changed less than this many seconds before a save is not recorded (see above).
RACY_S = 1.0
_LIMIT = 16 << 20  # a record is a few dozen bytes per tensor


def default_dir() -> str:
    """``$XDG_CACHE_HOME/onnx-prepared/verified`` (``~/.cache`` when unset), for the environment as it is
    now (every session asks: the answer is kept per value of the two variables it depends on)."""
    env = os.environ
    key = (env.get("XDG_CACHE_HOME"), env.get("HOME"))
    folder = _DIRS.get(key)
    if folder is None:
        base = key[0] or os.path.join(os.path.expanduser("~"), ".cache")
        folder = _DIRS[key] = os.path.join(base, "onnx-prepared", "verified")
    return folder


_DIRS: dict[tuple[str | None, str | None], str] = {}


#: the records' file name suffix
SUFFIX = ".rec"


def _path(folder: str, file: str) -> str:
    return os.path.join(folder, cache_files.crc_name(os.path.realpath(file)) + SUFFIX)


def load(folder: str, file: str, fp: str) -> dict[tuple[int, int], str]:
    """{(offset, length): digest} recorded for ``file`` under fingerprint ``fp``; {} if none is trusted."""
    try:
        data, _ = read_regular(_path(folder, file), limit=_LIMIT)
        rec = cache_files.load(data)
        if rec.get("file") != os.path.realpath(file) or rec.get("fingerprint") != fp:
            return {}
        out = {}
        for k, sha in rec["ranges"].items():
            off, length = (int(x) for x in k.split(":"))
            if isinstance(sha, str) and len(sha) in (32, 64):  # sha256 of a source, XXH3-128 of a payload
                out[(off, length)] = sha
        return out
    except (OSError, KeyError, AttributeError, *cache_files.LOAD_ERRORS):
        return {}


def save(folder: str, file: str, fp: str, ranges: dict[tuple[int, int], str]) -> None:
    """Record ``ranges`` (merged with a record of the same fingerprint) if ``file`` still has ``fp``."""
    with contextlib.suppress(OSError, ValueError):
        st = os.stat(file)
        if fingerprint(st) != fp:
            return  # changed since it was hashed: the record would be ignored anyway
        if changed_within(st, RACY_S):
            return  # racily fresh: a same-tick rewrite would keep this fingerprint
        merged = {**load(folder, file, fp), **ranges}
        os.makedirs(folder, exist_ok=True)
        body = cache_files.dump({"file": os.path.realpath(file), "fingerprint": fp,
                                 "ranges": {f"{o}:{n}": s for (o, n), s in sorted(merged.items())}})
        cache_files.write_atomic(_path(folder, file), body)
        _prune(folder)


def _prune(folder: str) -> None:
    names = [n for n in os.listdir(folder) if n.endswith((SUFFIX, ".json"))]  # (.json: an older format)
    if len(names) <= MAX_RECORDS:
        return
    aged = sorted(names, key=lambda n: os.stat(os.path.join(folder, n)).st_mtime_ns)
    for n in aged[: len(names) - MAX_RECORDS]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, n))
