"""On-demand reads of one weight's bytes into a numpy array.

``os.preadv`` (one call per tensor) into a preallocated buffer is the read path. ``benchmarks/read_path.py``
measured it against ``readinto``, ``mmap`` (copy out, and zero-copy views), two parallel preads per
tensor and ``FADV_SEQUENTIAL`` on a 1 GB file in 4-64 MB tensors: cold, preadv was 2-3x faster than
either mmap variant (readahead serves large explicit reads better than page faults) and no parallel or
hinted variant beat it; warm, preadv, readinto and mmap-copy were equal (memcpy-bound). Only a
zero-copy mapping is faster warm, because it moves no byte; it would also turn a file that shrinks
after load into a SIGBUS instead of an :class:`ExternalDataError`, so it is not used.
"""

from __future__ import annotations

import os
import stat
import sys
import threading

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_prepared.errors import ExternalDataError, ModelLoadError
from onnx_prepared.model.descriptors import ExternalPayload, WeightDescriptor, is_packed

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


class ExternalDataReader:
    """Reads descriptors' bytes with ``os.preadv``; file descriptors are opened once per file and shared.

    ``pread`` is position-free, so I/O workers can read concurrently with no lock around the read.
    ``read``/``read_bytes`` are thread-safe; ``close`` must not race with reads (a read after
    ``close`` reopens the file). ``bytes_read`` counts external-data bytes of completed reads
    (inline payloads are not counted).

    >>> with ExternalDataReader() as r:
    ...     w = r.read(loaded.weights["W"])
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # guards _fds and bytes_read
        self.bytes_read = 0

    # ---- file descriptors ----

    def _fd(self, desc: WeightDescriptor, file: str) -> int:
        fd = self._fds.get(file)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(file)
            if fd is None:
                fd = _open_regular(desc, file)
                self._fds[file] = fd
        return fd

    def close(self) -> None:
        """Close every cached file descriptor. Idempotent."""
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> ExternalDataReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reads ----

    def read_bytes(self, desc: WeightDescriptor, out: np.ndarray | None = None) -> np.ndarray:
        """The stored bytes of ``desc`` (packed for sub-byte types) as a 1-D uint8 array.

        With ``out`` (a writable C-contiguous uint8 array of at least ``desc.nbytes`` elements) the bytes
        land in ``out`` and ``out[:desc.nbytes]`` is returned. Otherwise external bytes go to a new buffer,
        and an inline tensor's ``raw_data`` comes back as a read-only view (no copy).
        Raises :class:`ExternalDataError` if the file is gone, shrank, or cannot be read.
        """
        p = desc.payload
        if not isinstance(p, ExternalPayload):
            return _copy_into(_inline_bytes(desc), out)
        buf = _check_out(out, p.length) if out is not None else np.empty(p.length, dtype=np.uint8)
        fd = self._fd(desc, p.file)
        try:
            size = os.fstat(fd).st_size
            if p.offset + p.length > size:
                raise ExternalDataError(f"external data file shrank to {size} bytes since load; tensor needs "
                                        f"bytes {p.offset}..{p.offset + p.length}", tensor=desc.name, file=p.file)
            mv, got = memoryview(buf), 0
            while got < p.length:
                n = os.preadv(fd, [mv[got:]], p.offset + got)
                if n == 0:
                    raise ExternalDataError(f"external data file truncated: got {got} of {p.length} bytes "
                                            f"at offset {p.offset}", tensor=desc.name, file=p.file)
                got += n
        except OSError as e:
            raise ExternalDataError(f"cannot read external data: {e.strerror or e}", tensor=desc.name,
                                    file=p.file) from None
        with self._lock:
            self.bytes_read += p.length
        return buf

    def read(self, desc: WeightDescriptor) -> np.ndarray:
        """The value of ``desc`` as a read-only numpy array of its logical dtype and shape.

        Same dtype, shape and values as ``onnx.numpy_helper.to_array`` on the fully loaded tensor
        (ml_dtypes types for bfloat16, float8 and the unpacked sub-byte types).
        """
        if isinstance(desc.payload, ExternalPayload):
            arr = decode(desc, self.read_bytes(desc))
        else:
            arr = _inline_array(desc)
        arr.flags.writeable = False
        return arr


def decode(desc: WeightDescriptor, raw: np.ndarray) -> np.ndarray:
    """Stored little-endian bytes -> the logical array (a view of ``raw`` unless the type is packed)."""
    if is_packed(desc.elem_type):
        # Sub-byte types: onnx owns the unpacking convention; give it an in-memory tensor.
        t = onnx.TensorProto(name=desc.name, data_type=desc.elem_type, dims=desc.dims, raw_data=raw.tobytes())
        return numpy_helper.to_array(t)
    arr = raw.view(desc.dtype).reshape(desc.dims)
    if sys.byteorder == "big" and desc.dtype.itemsize > 1:  # NOTE: untested here; ONNX bytes are little-endian
        arr = arr.byteswap()
    return arr


# ---- helpers ---------------------------------------------------------------------------------------


def _open_regular(desc: WeightDescriptor, file: str) -> int:
    # O_NOFOLLOW: load resolved symlinks to a real path, so a symlink here was swapped in since load.
    try:
        fd = os.open(file, _OPEN_FLAGS)
    except FileNotFoundError:
        raise ExternalDataError("external data file disappeared since load", tensor=desc.name, file=file) from None
    except OSError as e:
        raise ExternalDataError(f"cannot open external data file: {e.strerror or e}", tensor=desc.name,
                                file=file) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExternalDataError("external data file is no longer a regular file", tensor=desc.name, file=file)
    return fd


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
        return numpy_helper.to_array(desc.payload.tensor)
    except Exception as e:  # numpy/onnx raise assorted types for malformed typed fields
        raise ModelLoadError(f"cannot decode inline tensor {desc.name!r} ({desc.dims}): {e}") from None


def _inline_bytes(desc: WeightDescriptor) -> np.ndarray:
    """Stored bytes of an inline tensor: ``raw_data`` as is, or typed fields re-encoded the way raw_data would be."""
    t = desc.payload.tensor
    if t.data_type == onnx.TensorProto.STRING:
        raise ValueError(f"tensor {desc.name!r} is STRING: it has no fixed-size stored bytes")
    if t.HasField("raw_data"):
        return np.frombuffer(t.raw_data, dtype=np.uint8)
    raw = numpy_helper.from_array(_inline_array(desc)).raw_data
    return np.frombuffer(raw, dtype=np.uint8)
