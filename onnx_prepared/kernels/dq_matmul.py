"""Blocked INT4 DequantizeLinear feeding MatMul, run as one MatMulNBits on the native panel16 path.

onnxruntime fuses ``DequantizeLinear(x int4/uint4 [K, N], scale [K/bs, N], zp?, axis=0, block_size=bs)``
followed by ``MatMul(A, that)`` into MatMulNBits. :func:`onnx_prepared.resolve.fusions.fuse_dequantize_matmul`
rewrites the same pair into one internal node ``onnx_prepared::DequantizeMatMul(A, x, scale[, zp])``;
its prepack rule converts the int4 initializers into MatMulNBits's [N, k_blocks, bs/2] convention once and
packs them into the native layout. The arithmetic is level 0 (fp32): ONNX's DequantizeLinear + MatMul are
exact float math, and onnxruntime's fusion with ``session.qdq_matmulnbits_accuracy_level=0`` matches it.
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.kernels import _q4_panels as q4
from onnx_prepared.kernels._int4 import pack_bits
from onnx_prepared.kernels.matmul_nbits import matmul_nbits_packed, prepack_matmul_nbits
from onnx_prepared.kernels.prepack import PrepackSpec, prepack_rule
from onnx_prepared.kernels.quantize import dequantize_linear
from onnx_prepared.kernels.registry import kernel

FUSED_DOMAIN = "onnx_prepared"
FUSED_OP = "DequantizeMatMul"
#: block sizes the native kernel takes (MatMulNBits: powers of two, 16-256)
BLOCK_SIZES = frozenset({16, 32, 64, 128, 256})


@kernel(FUSED_OP, since=1, domain=FUSED_DOMAIN)
def dequantize_matmul(
    A: np.ndarray, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None, *, block_size: int
) -> tuple[np.ndarray]:
    """Unprepacked path (the weights were not constant after all): the two ops as written."""
    (w,) = dequantize_linear(x, scale, zero_point, axis=0, block_size=block_size)
    return (np.matmul(A, w),)


def to_matmul_nbits(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, block_size: int):
    """(B uint8 [N, kb, bs/2], scales [N, kb], packed uint4 zero points [N, ceil(kb/2)] or None) from the
    DequantizeLinear operands; int4 values are offset by 8 (so a missing int4 zero point is the symmetric
    zero point 8), a missing uint4 zero point is 0."""
    K, N = x.shape
    kb = -(-K // block_size)
    signed = x.dtype.name == "int4"
    q = x.astype(np.int16) + (8 if signed else 0)
    qt = np.zeros((N, kb * block_size), np.uint8)
    qt[:, :K] = q.T
    B = pack_bits(qt.reshape(N, kb, block_size), 4)
    scales = np.ascontiguousarray(np.asarray(scale, np.float32).T)
    if zero_point is None:
        zp = None if signed else pack_bits(np.zeros((N, kb), np.uint8), 4)
    else:
        zp = pack_bits((zero_point.astype(np.int16) + (8 if signed else 0)).T.astype(np.uint8), 4)
    return B, scales, zp


@prepack_rule(FUSED_OP, domain=FUSED_DOMAIN)
def dequantize_matmul_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    has_zp = len(node.input) > 3 and bool(node.input[3])
    sources = (1, 2, 3) if has_zp else (1, 2)
    if not set(sources) <= const_inputs or 0 in const_inputs:
        return None
    bs = int(attrs["block_size"])
    (K, N), dtype = const_shapes[1]
    symmetric = dtype == "int4" and not has_zp
    zk = q4.ZP_NONE if symmetric else q4.ZP_U4

    def pack(x, scale, zero_point=None):
        B, s, zp = to_matmul_nbits(x, scale, zero_point, bs)
        return prepack_matmul_nbits(B, s, zp, K=K, N=N, bits=4, block_size=bs)

    def run(packed, A: np.ndarray) -> tuple[np.ndarray]:
        return matmul_nbits_packed(A, packed, accuracy_level=0)

    # the source element type changes the packed bytes (the int4 offset), so it is part of the layout
    layout = f"dq-{dtype}-{q4.layout_key(bs, zk, K, N)}"
    return PrepackSpec(sources, layout, pack, run, q4.PackedQ4.to_bytes,
                       functools.partial(q4.PackedQ4.from_bytes, K=K, N=N, block_size=bs, zp_kind=zk),
                       sum(q4.section_sizes(K, N, bs, zk)))
