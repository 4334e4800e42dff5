"""Weight descriptors: what an initializer is and where its bytes live, with no bytes read.

Also the element-type facts every reader and validator needs: the numpy dtype of an ONNX element
type and the stored byte size of a tensor (sub-byte types are packed: INT4/UINT4/FLOAT4E2M1 two per
byte, INT2/UINT2 four per byte, FLOAT6 four per three bytes, as ``onnx.numpy_helper`` packs them).
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.records import field, record

_T = onnx.TensorProto

# Bits per stored element for the packed sub-byte types this onnx version knows.
_PACKED_BITS: dict[int, int] = {}
for _name, _bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
                     ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(_T, _name):
        _PACKED_BITS[getattr(_T, _name)] = _bits


def elem_type_name(elem_type: int) -> str:
    """``"FLOAT"`` for 1; ``"<unknown 99>"`` for a number this onnx version does not define."""
    try:
        return _T.DataType.Name(elem_type)
    except ValueError:
        return f"<unknown {elem_type}>"


@functools.cache
def np_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype ``onnx.numpy_helper.to_array`` returns for ``elem_type`` (ml_dtypes for exotic types).

    Raises ``ValueError`` for UNDEFINED and numbers this onnx version does not define.
    """
    if elem_type == _T.UNDEFINED:
        raise ValueError("element type is UNDEFINED")
    try:
        return np.dtype(onnx.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"unknown element type {elem_type}") from None


def bits_per_element(elem_type: int) -> int | None:
    """Stored bits per element, or None for types without a fixed size (STRING)."""
    bits = _BITS.get(elem_type)
    if bits is not None:
        return bits
    if elem_type == _T.STRING:
        return None
    bits = _PACKED_BITS.get(elem_type)
    bits = bits if bits is not None else np_dtype(elem_type).itemsize * 8
    _BITS[elem_type] = bits  # a pure function of the element type: asked per tensor, answered once
    return bits


_BITS: dict[int, int] = {}


def numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def expected_nbytes(elem_type: int, dims: tuple[int, ...]) -> int | None:
    """Stored byte size of a tensor (packed for sub-byte types), or None for STRING.

    Raises ``ValueError`` for an unknown element type.
    """
    bits = bits_per_element(elem_type)
    if bits is None:
        return None
    return (numel(dims) * bits + 7) // 8


def is_packed(elem_type: int) -> bool:
    """True for sub-byte types whose stored bytes are not a plain numpy view of the values."""
    return elem_type in _PACKED_BITS


@record(frozen=True, slots=True)
class ExternalPayload:
    """Bytes of one tensor inside an external data file (path validated and absolute, bounds checked)."""

    file: str
    offset: int
    length: int
    checksum: str | None = None  # as recorded by the producer; see model.checksum for the sha256 form
    #: ``safe_open.fingerprint`` of the file when the model was loaded: a digest of these bytes is
    #: trusted only while the file still has it (change detection, never identity).
    fingerprint: str | None = field(default=None, compare=False)


@record(frozen=True, slots=True)
class InlinePayload:
    """Bytes already inside the model protobuf (``raw_data`` or the typed ``*_data`` fields)."""

    tensor: onnx.TensorProto


@record(frozen=True, slots=True)
class WeightDescriptor:
    """One initializer: name, ONNX element type, dims and payload. Reading it is the reader's job.

    >>> d = loaded.weights["W"]
    >>> d.dtype, d.dims, d.nbytes, d.is_external
    (dtype('float32'), (64, 64), 16384, True)
    """

    name: str
    elem_type: int
    dims: tuple[int, ...]
    payload: ExternalPayload | InlinePayload
    #: the inline bytes' size when the loader computed it already (-1: computed on each ask)
    inline_nbytes: int = field(default=-1, compare=False, repr=False)

    @property
    def dtype(self) -> np.dtype:
        return np_dtype(self.elem_type)

    @property
    def numel(self) -> int:
        return numel(self.dims)

    @property
    def is_external(self) -> bool:
        return isinstance(self.payload, ExternalPayload)

    @property
    def checksum(self) -> str | None:
        """The producer's recorded checksum (external data only), never computed here."""
        return self.payload.checksum if isinstance(self.payload, ExternalPayload) else None

    @property
    def nbytes(self) -> int:
        """Size of the stored bytes (packed sub-byte types take their packed size)."""
        payload = self.payload
        if type(payload) is ExternalPayload:
            return payload.length
        if self.inline_nbytes >= 0:
            return self.inline_nbytes
        bits = _BITS.get(self.elem_type)  # expected_nbytes inlined for a type already asked (~87 reads of
        if bits is not None:  # a small CNN's 29 weights a construction)
            for d in self.dims:
                bits *= d
            return (bits + 7) // 8
        want = expected_nbytes(self.elem_type, self.dims)
        if want is not None:
            return want
        return sum(len(s) for s in self.payload.tensor.string_data)
