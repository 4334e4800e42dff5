"""8-bit MatMulNBits weights as two 4-bit panel16 halves, so they run on the native INT4 kernel.

A weight byte q = 16 * hi + lo and its zero point z = 16 * zh + zl give
``(q - z) * s = (hi - zh) * (16 s) + (lo - zl) * s``: the high nibbles form one 4-bit matrix with scales
16 s (exact: a power of two) and zero points zh, the low nibbles another with scales s and zero points
zl. ``y = A @ hi-part + A @ lo-part`` then costs two 4-bit passes over the same number of weight bytes as
the source (plus one more float32 scale array). With int8 activations (accuracy_level 4) each block's
integer dot of ``q - z`` is the sum of the two halves' integer dots, so the result is onnxruntime's
level-4 arithmetic up to float rounding of the two partial sums. The symmetric default zero point 128
is zh = 8 (the 4-bit symmetric zero point) and zl = 0.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _q4_panels as q4
from onnx_prepared.kernels._int4 import pack_bits
from onnx_prepared.kernels._q4_panels import PackedQ4
from onnx_prepared.records import record


@record(frozen=True, slots=True, eq=False)
class PackedQ8Split:
    """One 8-bit MatMulNBits node's weights: the high- and low-nibble halves in the panel16 layout."""

    hi: PackedQ4
    lo: PackedQ4

    @property
    def K(self) -> int:
        return self.hi.K

    @property
    def N(self) -> int:
        return self.hi.N

    @property
    def block_size(self) -> int:
        return self.hi.block_size

    @property
    def nbytes(self) -> int:
        return self.hi.nbytes + self.lo.nbytes

    @property
    def int8_capable(self) -> bool:
        """Both halves take the int8-activation path (float zero points do not)."""
        return self.lo.zp_kind != q4.ZP_F32

    def to_bytes(self) -> np.ndarray:
        """The persisted cache payload: the two halves' buffers back to back, no header (the layout key
        names K, N, block size and zero-point kind, hence both halves' sizes)."""
        out = np.empty(self.hi.nbytes + self.lo.nbytes, np.uint8)
        out[: self.hi.nbytes] = self.hi.data
        out[self.hi.nbytes:] = self.lo.data
        return out

    @classmethod
    def from_bytes(cls, buf, *, K: int, N: int, block_size: int, zp_kind: str) -> PackedQ8Split:
        """Zero-copy views of a payload written by :meth:`to_bytes` for ``layout_key(block_size, zp_kind, K, N)``."""
        raw = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
        hi, lo = _half_kinds(zp_kind)
        nh = sum(q4.section_sizes(K, N, block_size, hi))
        if raw.nbytes != packed_size(K, N, block_size, zp_kind):
            raise KernelError(f"MatMulNBits 8-bit packed payload holds {raw.nbytes} bytes, its layout "
                              f"{layout_key(block_size, zp_kind, K, N)} needs {packed_size(K, N, block_size, zp_kind)}")
        return cls(PackedQ4.from_bytes(raw[:nh], K=K, N=N, block_size=block_size, zp_kind=hi),
                   PackedQ4.from_bytes(raw[nh:], K=K, N=N, block_size=block_size, zp_kind=lo))


def layout_key(block_size: int, zp_kind: str, K: int, N: int) -> str:
    return f"matmul-nbits-q8-split-panel16-v{q4.LAYOUT_VERSION}-block{block_size}-{zp_kind}-k{K}-n{N}"


def zp_name(zero_points: np.ndarray | None) -> str:
    return "sym" if zero_points is None else ("zpu8" if np.asarray(zero_points).dtype == np.uint8 else "zpf32")


def _half_kinds(zp_kind: str) -> tuple[int, int]:
    """The 4-bit zero-point kinds of the (high, low) halves for an 8-bit zero-point kind."""
    if zp_kind not in ("sym", "zpu8", "zpf32"):
        raise KernelError(f"MatMulNBits 8-bit layout has an unknown zero-point kind {zp_kind!r}")
    return (q4.ZP_NONE if zp_kind == "sym" else q4.ZP_U4), (q4.ZP_F32 if zp_kind == "zpf32" else q4.ZP_U4)


def packed_size(K: int, N: int, block_size: int, zp_kind: str) -> int:
    hi, lo = _half_kinds(zp_kind)
    return sum(q4.section_sizes(K, N, block_size, hi)) + sum(q4.section_sizes(K, N, block_size, lo))


def pack_q8_split(B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, K: int, N: int,
                  block_size: int) -> PackedQ8Split:
    """Validated 8-bit MatMulNBits inputs (B uint8 [N, kb, bs], scales [N, kb], zero points uint8 [N, kb] or
    float [N, kb] or None) -> the two panel16 halves."""
    kb = -(-K // block_size)
    q = np.asarray(B, np.uint8).reshape(N, kb, block_size)
    s = np.asarray(scales, np.float32).reshape(N, kb)
    hi_b = pack_bits(q >> 4, 4)
    lo_b = pack_bits(q & 15, 4)
    zeros = pack_bits(np.zeros((N, kb), np.uint8), 4)
    if zero_points is None:
        zh, zl = None, zeros
    elif np.asarray(zero_points).dtype == np.uint8:
        z = np.asarray(zero_points, np.uint8).reshape(N, kb)
        zh, zl = pack_bits(z >> 4, 4), pack_bits(z & 15, 4)
    else:
        zh, zl = zeros, np.asarray(zero_points, np.float32).reshape(N, kb)
    hi = q4.pack_q4(hi_b, s * np.float32(16), zh, K=K, N=N, block_size=block_size)
    lo = q4.pack_q4(lo_b, s, zl, K=K, N=N, block_size=block_size)
    return PackedQ8Split(hi, lo)
