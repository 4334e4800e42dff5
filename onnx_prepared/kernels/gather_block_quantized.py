"""com.microsoft GatherBlockQuantized: Gather on a block-quantized table, dequantizing only what it gathers.

``data`` is uint8 (``bits`` < 8 values packed low-bits-first along the last axis; then ``gather_axis``
must be 0 and differ from ``quantize_axis``) or onnx int4/uint4 (one element per byte as numpy holds
them). ``scales`` has data's logical shape with ``ceil(dim / block_size)`` on ``quantize_axis``;
``zero_points`` (optional) has the scales' shape, packed like data for uint8. Default zero point: 0 for
int4/uint4, ``2 ** (bits - 1)`` for uint8. ``output = (q - zero_point) * scale`` in the scales' dtype;
an index outside ``[-s, s)`` yields zeros, as onnxruntime documents. FP8/FP4 data is not supported.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels._int4 import is_int4_dtype, is_uint4_dtype, unpack_bits
from onnx_prepared.kernels.registry import kernel

_OP = "GatherBlockQuantized"


def _logical(a: np.ndarray, packed_bits: int, count: int | None = None) -> np.ndarray:
    """Integer values of a (gathered) data or zero-point tensor."""
    if packed_bits:
        return unpack_bits(a, packed_bits, count).astype(np.int16)
    return a.astype(np.int16)


@kernel("GatherBlockQuantized", since=1, domain="com.microsoft")
def gather_block_quantized(
    data: np.ndarray,
    indices: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    *,
    bits: int = 4,
    block_size: int = 128,
    gather_axis: int = 0,
    quantize_axis: int = 1,
) -> tuple[np.ndarray]:
    r = data.ndim
    ga = gather_axis + r if gather_axis < 0 else gather_axis
    qa = quantize_axis + r if quantize_axis < 0 else quantize_axis
    if not (0 <= ga < r and 0 <= qa < r):
        raise KernelError(f"{_OP}: gather_axis={gather_axis} / quantize_axis={quantize_axis} out of range for rank {r}")
    if block_size < 16 or block_size & (block_size - 1):
        raise KernelError(f"{_OP}: block_size={block_size} must be a power of two >= 16")
    if data.dtype == np.uint8:
        if bits not in (2, 4, 8):
            raise KernelError(f"{_OP}: bits={bits} must be 2, 4 or 8 for uint8 data")
        packed_bits = bits if bits < 8 else 0
        if packed_bits and (ga != 0 or ga == qa):
            raise KernelError(f"{_OP}: packed uint8 data needs gather_axis=0 != quantize_axis")
        default_zp = 1 << (bits - 1)
        logical_last = data.shape[-1] * (8 // bits)
    elif is_int4_dtype(data.dtype) or is_uint4_dtype(data.dtype):
        packed_bits, default_zp, logical_last = 0, 0, data.shape[-1]
    else:
        raise KernelError(f"{_OP}: data dtype {data.dtype} is not supported (uint8, int4, uint4)")
    logical_shape = data.shape[:-1] + (logical_last,)
    n_blocks = -(-logical_shape[qa] // block_size)
    if scales.ndim != r or scales.shape[qa] != n_blocks:
        raise KernelError(
            f"{_OP}: scales shape {list(scales.shape)} does not match data {list(logical_shape)} "
            f"with {n_blocks} blocks on axis {qa}"
        )
    if (packed_bits and qa == r - 1 == 1 and logical_last == n_blocks * block_size and native._ext is not None
            and scales.dtype == np.float32 and (zero_points is None or zero_points.dtype == np.uint8)):
        # genai's tied embedding, one pass in C (one decode token: one row)
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        out = np.empty(idx.shape + (logical_last,), np.float32)
        native._ext.gbq_rows(np.ascontiguousarray(data), idx, np.ascontiguousarray(scales),
                             None if zero_points is None else np.ascontiguousarray(zero_points),
                             out.reshape(-1, logical_last), packed_bits, block_size, default_zp)
        return (out,)
    idx = np.asarray(indices).astype(np.int64)
    size = logical_shape[ga]
    valid = (idx >= -size) & (idx < size)
    safe = np.where(valid, np.where(idx < 0, idx + size, idx), 0)

    if packed_bits and qa == r - 1 and logical_last == n_blocks * block_size:
        # genai's tied embedding (uint8 [V, H/2], gather rows): dequantize per whole block, float32 in place
        q = unpack_bits(np.take(data, safe, axis=0), packed_bits).astype(np.float32)
        q = q.reshape(q.shape[:-1] + (n_blocks, block_size))
        if zero_points is None:
            q -= np.float32(default_zp)
        else:
            q -= unpack_bits(np.take(zero_points, safe, axis=0), packed_bits, n_blocks).astype(np.float32)[..., None]
        q *= np.take(scales, safe, axis=0).astype(np.float32, copy=False)[..., None]
        out = q.reshape(q.shape[:-2] + (logical_last,)).astype(scales.dtype, copy=False)
    elif ga == qa:  # only for int4/uint4: dequantize the whole table, then gather
        deq = _dequant(_logical(data, 0), scales, zero_points, 0, default_zp, qa, block_size, logical_shape[qa])
        out = np.take(deq, safe, axis=ga)
    else:
        q = _logical(np.take(data, safe, axis=ga), packed_bits, logical_last)
        s = np.take(scales, safe, axis=ga)
        zp = None if zero_points is None else np.take(zero_points, safe, axis=ga)
        qa_out = qa + idx.ndim - 1 if qa > ga else qa
        out = _dequant(q, s, zp, packed_bits, default_zp, qa_out, block_size, logical_shape[qa])
    if not valid.all():
        shape = (1,) * ga + valid.shape + (1,) * (r - ga - 1)
        out = np.where(valid.reshape(shape), out, 0).astype(out.dtype)
    return (out,)


def _dequant(q, s, zp, packed_bits, default_zp, axis, block_size, length):
    sc = np.repeat(s, block_size, axis=axis)
    sc = np.take(sc, np.arange(length), axis=axis)
    if zp is None:
        z = np.int16(default_zp)
    else:
        z = _logical(zp, packed_bits, s.shape[-1] if packed_bits else None)
        z = np.take(np.repeat(z, block_size, axis=axis), np.arange(length), axis=axis)
    out = (q - z).astype(np.float32) * sc.astype(np.float32)
    return out.astype(s.dtype)
