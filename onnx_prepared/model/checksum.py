"""sha256 checksums of stored tensor bytes, for descriptors whose external data records one.

The producer writes ``checksum`` = hex sha256 of the tensor's stored bytes (the bytes at
``offset..offset+length``), optionally prefixed ``sha256:``. Nothing here runs at load: a digest is
computed only when a caller holds the bytes (after a read), so checksums can serve as source digests
without extra I/O. Other checksum forms (the ONNX spec's SHA1-of-file) are kept on the descriptor but
are not verifiable here.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.model.descriptors import WeightDescriptor, is_packed

_HEX = frozenset("0123456789abcdefABCDEF")  # string.hexdigits


def sha256_hex(data: bytes | bytearray | memoryview | np.ndarray) -> str:
    """Hex sha256 of ``data`` (an ndarray is hashed as its C-order bytes; the GIL is released while hashing)."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    import hashlib  # OpenSSL loads on the first checksum, not with the package

    return hashlib.sha256(data).hexdigest()


def recorded_sha256(desc: WeightDescriptor) -> str | None:
    """The lower-case hex sha256 recorded for ``desc``, or None when absent or not in sha256 form."""
    c = desc.checksum
    if c is None:
        return None
    c = c.strip().lower()
    if c.startswith("sha256:"):
        c = c[len("sha256:"):]
    return c if len(c) == 64 and set(c) <= _HEX else None


def verify_checksum(desc: WeightDescriptor, data: bytes | bytearray | memoryview | np.ndarray) -> bool:
    """True if ``data`` (the stored bytes, as ``ExternalDataReader.read_bytes`` returns) matches the
    sha256 recorded for ``desc``.

    Raises ``ValueError`` if ``desc`` records no sha256 checksum, or if ``data`` is a decoded array of a
    packed sub-byte type (its bytes are not the stored bytes).

    >>> raw = reader.read_bytes(desc)
    >>> verify_checksum(desc, raw)
    True
    """
    want = recorded_sha256(desc)
    if want is None:
        raise ValueError(f"tensor {desc.name!r} records no sha256 checksum (checksum={desc.checksum!r})")
    if isinstance(data, np.ndarray) and data.dtype != np.uint8 and is_packed(desc.elem_type):
        raise ValueError(f"tensor {desc.name!r} is packed: pass its stored bytes (read_bytes), not the decoded array")
    return sha256_hex(data) == want
