"""Weight descriptors: what an initializer is and where its bytes live, with no bytes read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper


@dataclass(frozen=True, slots=True)
class ExternalPayload:
    """Bytes of one tensor inside an external data file (path already validated, absolute)."""

    file: str
    offset: int
    length: int
    checksum: str | None = None  # hex sha256 when the producer recorded one


@dataclass(frozen=True, slots=True)
class InlinePayload:
    """Bytes already inside the model protobuf (small tensors)."""

    tensor: onnx.TensorProto


@dataclass(frozen=True, slots=True)
class WeightDescriptor:
    """One initializer: name, ONNX element type, dims and payload. Reading it is the reader's job."""

    name: str
    elem_type: int
    dims: tuple[int, ...]
    payload: ExternalPayload | InlinePayload

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def is_external(self) -> bool:
        return isinstance(self.payload, ExternalPayload)

    @property
    def nbytes(self) -> int:
        """Size of the stored bytes (packed sub-byte types take their packed size)."""
        if isinstance(self.payload, ExternalPayload):
            return self.payload.length
        return len(self.payload.tensor.raw_data) or self.numel * self.dtype.itemsize
