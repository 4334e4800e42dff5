"""The small cache files of the model layer (schema facts, verification records): how they are named,
serialized and written, in one place.

They are read by a process's first session and its cold run's I/O threads, so nothing here loads ``json``
or OpenSSL's ``hashlib``: the contents are ``marshal`` data (plain dicts, lists, strings and ints; marshal
builds objects, it runs nothing) and the names CRCs. Each file records what it is about, so a name clash
only costs a rewrite.
"""

from __future__ import annotations

import binascii
import contextlib
import marshal
import os

#: marshal's format version (4 since Python 3.4), written by :func:`dump`
MARSHAL_VERSION = 4


def crc_name(key: str) -> str:
    """16 hex digits naming ``key``: two CRC32s of it (different seeds)."""
    b = key.encode()
    return f"{binascii.crc32(b):08x}{binascii.crc32(b, 0x9E3779B9):08x}"


def dump(obj: object) -> bytes:
    return marshal.dumps(obj, MARSHAL_VERSION)


#: what :func:`load` of a corrupt, truncated or foreign file raises
LOAD_ERRORS = (ValueError, EOFError, TypeError)


def load(data: bytes) -> object:
    return marshal.loads(data)


def write_atomic(path: str, body: bytes) -> None:
    """``body`` into ``path`` through a temporary file and ``os.replace`` (readers see the old file or the
    new one); raises OSError."""
    tmp = f"{path}.{os.urandom(6).hex()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone after a successful replace
