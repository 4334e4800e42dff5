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
"""

from __future__ import annotations

import string

#: Name of the algorithm, as the companion's ``payload_checksum`` metadata records it.
ALGORITHM = "xxh3_128"
#: Bytes read (and then hashed) per ``preadv`` when a payload is verified while it is read.
CHUNK = 8 << 20
_HEX = frozenset(string.hexdigits.lower())


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
