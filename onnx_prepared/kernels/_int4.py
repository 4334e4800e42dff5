"""Sub-byte integer packing shared by the quantized kernels (MatMulNBits, GatherBlockQuantized).

onnxruntime packs ``bits``-wide unsigned values along the last axis of a uint8 tensor, low-order bits
first: for 4 bits, element ``2j`` is the low nibble of byte ``j`` and element ``2j + 1`` the high one.
"""

from __future__ import annotations

import numpy as np

#: element types of onnx's 4-bit tensors as onnx.numpy_helper returns them (one element per byte)
_INT4_NAMES = frozenset({"int4"})
_UINT4_NAMES = frozenset({"uint4"})


def unpack_bits(packed: np.ndarray, bits: int, count: int | None = None) -> np.ndarray:
    """Unsigned ``bits``-wide values packed low-bits-first along the last axis of a uint8 array.

    Returns uint8 with the last axis multiplied by ``8 // bits`` (then cut to ``count`` when given).

    >>> unpack_bits(np.array([0x21], np.uint8), 4)
    array([1, 2], dtype=uint8)
    """
    if bits == 8:
        out = np.asarray(packed, dtype=np.uint8)
    else:
        per = 8 // bits
        mask = np.uint8((1 << bits) - 1)
        p = np.asarray(packed, dtype=np.uint8)
        out = np.empty(p.shape + (per,), np.uint8)
        for i in range(per):
            np.bitwise_and(np.right_shift(p, np.uint8(bits * i)), mask, out=out[..., i])
        out = out.reshape(p.shape[:-1] + (p.shape[-1] * per,))
    return out if count is None else out[..., :count]


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`unpack_bits`: pack unsigned values along the last axis (zero-padded to a byte)."""
    v = np.asarray(values).astype(np.uint8)
    if bits == 8:
        return v
    per = 8 // bits
    pad = (-v.shape[-1]) % per
    if pad:
        v = np.concatenate([v, np.zeros(v.shape[:-1] + (pad,), np.uint8)], axis=-1)
    v = v.reshape(v.shape[:-1] + (v.shape[-1] // per, per))
    out = np.zeros(v.shape[:-1], np.uint8)
    for i in range(per):
        out |= (v[..., i] & np.uint8((1 << bits) - 1)) << np.uint8(bits * i)
    return out


def is_int4_dtype(dtype: np.dtype) -> bool:
    return np.dtype(dtype).name in _INT4_NAMES


def is_uint4_dtype(dtype: np.dtype) -> bool:
    return np.dtype(dtype).name in _UINT4_NAMES


def sub_byte_to_int(a: np.ndarray) -> np.ndarray:
    """An onnx int4/uint4 array (one element per byte) as int16 values; other integer arrays unchanged."""
    if is_int4_dtype(a.dtype) or is_uint4_dtype(a.dtype):
        return a.astype(np.int16)
    return a
