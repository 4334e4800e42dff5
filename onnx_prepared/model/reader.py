"""On-demand reads of one weight's bytes into a numpy array."""

from __future__ import annotations

import os
import threading

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_prepared.errors import ExternalDataError
from onnx_prepared.model.descriptors import ExternalPayload, WeightDescriptor


class ExternalDataReader:
    """Reads a descriptor's bytes with ``os.preadv`` into a preallocated buffer.

    File descriptors are opened once per file and shared; ``pread`` is position-free, so concurrent
    reads from several I/O workers need no lock around the read itself. Thread-safe.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0

    def _fd(self, file: str) -> int:
        fd = self._fds.get(file)
        if fd is None:
            with self._lock:
                fd = self._fds.get(file)
                if fd is None:
                    fd = os.open(file, os.O_RDONLY)
                    self._fds[file] = fd
        return fd

    def read_bytes(self, desc: WeightDescriptor, out: np.ndarray | None = None) -> np.ndarray:
        """The raw stored bytes of ``desc`` as a uint8 array (``out`` reused when given)."""
        p = desc.payload
        if not isinstance(p, ExternalPayload):
            return np.frombuffer(p.tensor.raw_data, dtype=np.uint8)
        buf = np.empty(p.length, dtype=np.uint8) if out is None else out
        try:
            fd = self._fd(p.file)
            got, mv = 0, memoryview(buf)
            while got < p.length:
                n = os.preadv(fd, [mv[got:]], p.offset + got)
                if n == 0:
                    raise ExternalDataError(f"external data file truncated after {got} of {p.length} bytes",
                                            tensor=desc.name, file=p.file)
                got += n
        except OSError as e:
            raise ExternalDataError(f"cannot read external data: {e.strerror}", tensor=desc.name, file=p.file) from None
        with self._lock:
            self.bytes_read += p.length
        return buf

    def read(self, desc: WeightDescriptor) -> np.ndarray:
        """The tensor value of ``desc`` as a numpy array of its logical dtype and shape."""
        p = desc.payload
        if not isinstance(p, ExternalPayload):
            return numpy_helper.to_array(p.tensor)
        raw = self.read_bytes(desc)
        if desc.elem_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) or desc.dtype.kind not in "biufc":
            # Sub-byte and exotic types: let onnx decode them from an in-memory TensorProto.
            t = onnx.TensorProto(name=desc.name, data_type=desc.elem_type, dims=desc.dims, raw_data=raw.tobytes())
            return numpy_helper.to_array(t)
        return raw.view(desc.dtype).reshape(desc.dims)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> ExternalDataReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
