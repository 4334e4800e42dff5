"""Streaming writer for one external-data file: aligned offsets and a sha256 per tensor.

``onnx.save``'s external-data writer neither aligns offsets nor records checksums, so the generator
writes the payload itself. Every tensor starts at a multiple of ``alignment`` (4096: a page, so a
reader can mmap or O_DIRECT each tensor), and its external-data entry carries
``checksum`` = hex sha256 of exactly its ``length`` bytes. Later stages (prepared-cache keys) can then
trust source digests without reading payloads.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

import numpy as np
import onnx

ALIGNMENT = 4096


class ExternalDataWriter:
    """Append tensors to ``path``; each :meth:`add` returns the initializer describing them.

    The file is written to ``path + ".tmp"`` and renamed on :meth:`close`, so a failed run never
    leaves a truncated data file under the final name. Not thread-safe (one writer per file).
    """

    def __init__(self, path: str, location: str, alignment: int = ALIGNMENT) -> None:
        self.path = path
        self.location = location
        self.alignment = alignment
        self._tmp = path + ".tmp"
        self._f = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
        self.offset = 0  # invariant: equals the bytes written to _f so far
        self.padding = 0

    def add(
        self,
        name: str,
        elem_type: int,
        dims: tuple[int, ...],
        chunks: Iterable[np.ndarray | bytes],
        metadata: dict[str, str] | None = None,
    ) -> onnx.TensorProto:
        """Write ``chunks`` (C-contiguous arrays or bytes, concatenated) as tensor ``name``."""
        pad = -self.offset % self.alignment
        if pad:
            self._f.write(b"\0" * pad)
            self.offset += pad
            self.padding += pad
        start, h = self.offset, hashlib.sha256()
        for c in chunks:
            mv = memoryview(np.ascontiguousarray(c) if isinstance(c, np.ndarray) else c).cast("B")
            self._f.write(mv)
            h.update(mv)
            self.offset += mv.nbytes
        t = onnx.TensorProto(name=name, data_type=elem_type, dims=dims, data_location=onnx.TensorProto.EXTERNAL)
        for key, value in (("location", self.location), ("offset", str(start)),
                           ("length", str(self.offset - start)), ("checksum", h.hexdigest())):
            e = t.external_data.add()
            e.key, e.value = key, value
        for key, value in (metadata or {}).items():
            p = t.metadata_props.add()
            p.key, p.value = key, value
        return t

    def close(self) -> None:
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._f.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)
