"""The companion's payload checksum: XXH3-128 (xxhash), computed while the payload is read.

A payload checksum only detects corruption (bit flips, torn or overwritten files): identity is the
entry's lineage digest and its identity record. So it needs no cryptographic hash, and sha256 (1.9
GB/s with SHA-NI here) cost 150-270 ms of CPU per cold start of a complete cache on 2 cores. Measured
on this machine (256 MiB buffer, best of 3): XXH3-128 36 GB/s, crc32c 19 GB/s, zlib.crc32 6.5 GB/s,
sha256 1.9 GB/s; xxhash, crc32c and hashlib all release the GIL while hashing (another thread's
longest pause during a 1 GiB hash: 0.02-0.07 ms). XXH3-128 is the fastest and 128 bits wide, and the
``xxhash`` wheel is small (470 KB), so it is a core dependency.

A mapped payload (``cache_io.map_payload``, a hit's default) is hashed whole once mapped; a copied one
chunk by chunk right after each chunk's ``preadv`` (``CHUNK`` bytes, so the bytes are still in cache when
hashed). Either way in whichever I/O worker reads it, with the GIL released.

What matched is remembered twice: per process (``remember_verified``), and across processes in a
verification record of the data file (model/verified.py's records: one small JSON per data file under
``$XDG_CACHE_HOME/onnx-prepared/verified``, trusted only while the file keeps the stat fingerprint it had
when hashed, never for a file changed within ``verified.RACY_S``), so a later cold start of the same
companion hashes nothing: the sources' rule (docs/reliability.md), applied to payload checksums. A data
file is never rewritten in place by onnx-prepared; a rewrite by anything else changes its ctime, so its
record is ignored and the payloads are hashed again before use. The identity record is still checked on
every read.
"""

from __future__ import annotations

import os
import threading

from onnx_prepared.model.safe_open import changed_within, fingerprint

#: Name of the algorithm, as the companion's ``payload_checksum`` metadata records it.
ALGORITHM = "xxh3_128"
#: Bytes read (and then hashed) per ``preadv`` when a payload is verified while it is read.
CHUNK = 8 << 20
_HEX = frozenset("0123456789abcdef")


def hasher():
    """A new incremental XXH3-128 hasher (``update(buffer)``, ``hexdigest()``)."""
    import xxhash  # NOTE: lazy: only a cache read or write needs it, not every import of the package

    return xxhash.xxh3_128()


def checksum(data) -> str:
    """Hex XXH3-128 of ``data`` (any buffer)."""
    h = hasher()
    h.update(memoryview(data).cast("B"))
    return h.hexdigest()


def is_checksum(value: str) -> bool:
    """True for a lower-case hex XXH3-128 (32 digits)."""
    return len(value) == 32 and set(value) <= _HEX


# ---- verified once per process -----------------------------------------------------------------------

#: A data file changed less than this many seconds ago is not remembered: file timestamps come from a
#: coarse clock (a few ms), so a rewrite in place right after the hash could keep the same fingerprint.
RACY_S = 1.0
#: At most this many payloads are remembered (then the memo starts over: a re-hash, never a wrong hit).
MEMO_LIMIT = 1 << 16
_memo: set[tuple[str, int, int, str]] = set()
_memo_lock = threading.Lock()


def payload_identity(st: os.stat_result, offset: int, length: int, checksum_hex: str) -> tuple[str, int, int, str]:
    """What a verified payload is remembered by: its data file's fingerprint (device, inode, size,
    mtime_ns, ctime_ns, from ``fstat`` of the descriptor read), its offset and length, and the checksum
    it matched. A rewritten or replaced file has another fingerprint, so it is hashed again."""
    return fingerprint(st), offset, length, checksum_hex


def verified_in_process(ident: tuple[str, int, int, str]) -> bool:
    """Whether a store of this process already matched this payload against its checksum."""
    return ident in _memo


def remember_verified(ident: tuple[str, int, int, str], st: os.stat_result) -> bool:
    """Remember a payload that matched its checksum, unless its file changed within ``RACY_S`` seconds
    (its fingerprint would not yet tell a rewrite apart); True if remembered."""
    if changed_within(st, RACY_S):
        return False
    with _memo_lock:
        if len(_memo) >= MEMO_LIMIT:
            _memo.clear()
        _memo.add(ident)
    return True


def forget_verified() -> None:
    """Drop the process memo and the records read or queued (tests, or after restoring a file's timestamps by hand)."""
    with _memo_lock:
        _memo.clear()
        _records.clear()
        _pending.clear()


# ---- verified across processes -------------------------------------------------------------------------

#: (data file, fingerprint) -> {(offset, length): checksum} its verification record trusts
_records: dict[tuple[str, str], dict[tuple[int, int], str]] = {}
#: data file -> (fingerprint, {(offset, length): checksum}) verified here and not yet saved in its record
_pending: dict[str, tuple[str, dict[tuple[int, int], str]]] = {}


def verified_on_disk(file: str, ident: tuple[str, int, int, str]) -> bool:
    """Whether ``file``'s verification record says this payload matched its checksum under the file's
    current fingerprint (``ident`` from ``payload_identity``); the record is read once per process."""
    from onnx_prepared.model import verified

    fp, offset, length, checksum_hex = ident
    rec = _records.get((file, fp))
    if rec is None:
        rec = verified.load(verified.default_dir(), file, fp)  # {} when absent, foreign or for another fingerprint
        with _memo_lock:
            _records[(file, fp)] = rec
    return rec.get((offset, length)) == checksum_hex


def queue_record(file: str, ident: tuple[str, int, int, str]) -> None:
    """Queue a payload that matched for ``file``'s verification record (``save_records`` writes it)."""
    fp, offset, length, checksum_hex = ident
    with _memo_lock:
        have = _pending.get(file)
        if have is None or have[0] != fp:
            have = _pending[file] = (fp, {})
        have[1][(offset, length)] = checksum_hex


def save_records(files) -> None:
    """Write the queued ranges of ``files`` into their verification records (merged with what a record
    of the same fingerprint holds). Best effort: an unwritable folder or a file changed since is skipped."""
    from onnx_prepared.model import verified

    for file in files:
        with _memo_lock:
            item = _pending.pop(file, None)
        if item:
            fp, ranges = item
            verified.save(verified.default_dir(), file, fp, ranges)
            with _memo_lock:
                _records.setdefault((file, fp), {}).update(ranges)
