"""The ``panel16`` packed layout of 4-bit MatMulNBits weights, and its numpy compute (the fallback).

One uint8 buffer, sections in order (``P = ceil(N / 16)`` panels of 16 output columns, ``kb`` blocks,
``kc = kb * block_size / 8`` chunks of 8 k values per panel):

- ``qw``: ``[P][kc][16]`` little-endian uint32; byte ``i`` (0..3) of word ``(p, c, l)`` holds
  ``q[8c + i, 16p + l]`` in its low nibble and ``q[8c + i + 4, 16p + l]`` in its high nibble, so the low
  nibbles of a word are k values 0-3 of the chunk and the high nibbles 4-7: one int8 dot of either with
  four consecutive activations is one aligned quad of k values, the unit onnxruntime's accuracy_level 4
  accumulates in (``_native/nbits.h``). Packing is a transpose of the source's uint32 words (MatMulNBits
  stores k values low nibble first) with that nibble interleave applied to each word.
- ``scales``: float32 ``[P][kb][16]``.
- zero points: none (symmetric: 8 is implied, no array stored), nibbles ``[P][kb][8]`` (byte ``i`` holds
  column ``2i`` low and ``2i + 1`` high) for packed uint4 sources, or float32 ``[P][kb][16]``.

Columns past N and k past K hold ``q = 0`` and scale 0. The packed size equals the source's when N is
a multiple of 16 (the last panel's padding is the only growth), and so does the persisted payload
(no header: the layout key names every parameter). The layout does not depend on the CPU:
every dispatch level of the native extension and the numpy code below read the same bytes. The C side
of the contract is ``_native/nbits.h``.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels._int4 import unpack_bits
from onnx_prepared.memory.aligned import aligned_empty
from onnx_prepared.records import record

#: bumped whenever the bytes of this layout change (part of every layout key)
LAYOUT_VERSION = 2
ZP_NONE, ZP_U4, ZP_F32 = 0, 1, 2
_ZP_NAMES = {ZP_NONE: "sym", ZP_U4: "zpu4", ZP_F32: "zpf32"}
#: rows x blocks x columns of fp32 temporaries per step of the numpy int8 path
_NUMPY_CHUNK = 1 << 22


def layout_key(block_size: int, zp_kind: int, K: int, N: int) -> str:
    """Names every parameter that changes the packed bytes, including the layout version."""
    return f"matmul-nbits-q4-panel16-v{LAYOUT_VERSION}-block{block_size}-{_ZP_NAMES[zp_kind]}-k{K}-n{N}"


def section_sizes(K: int, N: int, block_size: int, zp_kind: int) -> tuple[int, int, int]:
    """Bytes of the (qw, scales, zero points) sections."""
    P, kb = -(-N // 16), -(-K // block_size)
    zp = {ZP_NONE: 0, ZP_U4: P * kb * 8, ZP_F32: P * kb * 64}[zp_kind]
    return P * kb * block_size * 8, P * kb * 64, zp


@record(frozen=True, slots=True, eq=False)
class PackedQ4:
    """One node's 4-bit weights in the panel16 layout (``data`` is the whole buffer)."""

    K: int
    N: int
    block_size: int
    zp_kind: int
    data: np.ndarray  # uint8, C-contiguous

    bits = 4

    @property
    def layout(self) -> str:
        return layout_key(self.block_size, self.zp_kind, self.K, self.N)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def to_bytes(self) -> np.ndarray:
        """The persisted cache payload: the buffer itself, no header, so an entry is never larger than its
        source (N a multiple of 16). K, N, block size, zero-point kind and layout version are named by
        the layout key, which the companion records per entry and in each payload's identity record;
        :meth:`from_bytes` takes them from it."""
        return self.data

    @classmethod
    def from_bytes(cls, buf, *, K: int, N: int, block_size: int, zp_kind: int) -> PackedQ4:
        """Zero-copy view of a payload written by :meth:`to_bytes` for layout ``layout_key(block_size,
        zp_kind, K, N)``; its size must be that layout's."""
        raw = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)
        if zp_kind not in _ZP_NAMES:
            raise KernelError(f"MatMulNBits packed layout has an unknown zero-point kind {zp_kind}")
        need = sum(section_sizes(K, N, block_size, zp_kind))
        if raw.nbytes != need:
            raise KernelError(f"MatMulNBits packed payload holds {raw.nbytes} bytes, its layout "
                              f"{layout_key(block_size, zp_kind, K, N)} needs {need}")
        return cls(K, N, block_size, zp_kind, raw)

    def sections(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(qw uint32 [P, kc, 16], scales float32 [P, kb, 16], zero points or None) as views."""
        nq, ns, nz = section_sizes(self.K, self.N, self.block_size, self.zp_kind)
        P, kb = -(-self.N // 16), -(-self.K // self.block_size)
        qw = self.data[:nq].view("<u4").reshape(P, -1, 16)
        sc = self.data[nq: nq + ns].view(np.float32).reshape(P, kb, 16)
        zp = None
        if self.zp_kind == ZP_U4:
            zp = self.data[nq + ns: nq + ns + nz].reshape(P, kb, 8)
        elif self.zp_kind == ZP_F32:
            zp = self.data[nq + ns: nq + ns + nz].view(np.float32).reshape(P, kb, 16)
        return qw, sc, zp


def pack_q4(B: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, K: int, N: int,
            block_size: int, out: np.ndarray | None = None) -> PackedQ4:
    """Repack validated 4-bit MatMulNBits inputs (B uint8 [N, kb, bs/2]) into the panel16 layout.

    ``out``: a C-contiguous uint8 buffer of exactly the layout's size to pack into (a reused scratch;
    every byte is written), instead of a new one (:func:`aligned_empty`)."""
    kb = -(-K // block_size)
    P = -(-N // 16)
    npad = 16 * P
    zk = ZP_NONE if zero_points is None else (ZP_U4 if zero_points.dtype == np.uint8 else ZP_F32)
    nq, ns, nz = section_sizes(K, N, block_size, zk)
    data = aligned_empty(nq + ns + nz) if out is None else out
    words = np.ascontiguousarray(B).reshape(N, -1).view("<u4")  # [N, kc]
    qw = data[:nq].view("<u4").reshape(P, -1, 16)
    if npad == N:
        if not native.panel16_u32(words, qw):
            qw[...] = interleave_nibbles(words).reshape(P, 16, -1).transpose(0, 2, 1)
    else:
        qw[...] = 0
        words = interleave_nibbles(words)
        for p in range(P):
            n0, n1 = 16 * p, min(N, 16 * p + 16)
            qw[p, :, : n1 - n0] = words[n0:n1].T
    _panelize(np.asarray(scales, dtype=np.float32).reshape(N, kb), data[nq: nq + ns].view(np.float32), P, kb)
    if zk == ZP_U4:
        z = unpack_bits(np.asarray(zero_points).reshape(N, -1), 4, kb)  # [N, kb] uint8
        zpad = np.zeros((npad, kb), np.uint8)
        zpad[:N] = z
        pairs = zpad.reshape(P, 8, 2, kb).transpose(0, 3, 1, 2)  # [P, kb, 8, 2]
        data[nq + ns:] = (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(-1)
    elif zk == ZP_F32:
        _panelize(np.asarray(zero_points, dtype=np.float32).reshape(N, kb), data[nq + ns:].view(np.float32), P, kb)
    return PackedQ4(K, N, block_size, zk, data)


def interleave_nibbles(words: np.ndarray) -> np.ndarray:
    """Source words (nibble j = k value j) -> layout words (byte i = k values i and i + 4)."""

    def spread(x: np.ndarray) -> np.ndarray:  # 4 nibbles -> the low nibbles of 4 bytes
        x = (x | (x << np.uint32(8))) & np.uint32(0x00FF00FF)
        return (x | (x << np.uint32(4))) & np.uint32(0x0F0F0F0F)

    w = words.astype(np.uint32, copy=False)
    return spread(w & np.uint32(0xFFFF)) | (spread(w >> np.uint32(16)) << np.uint32(4))


#: nibble index of k value j of a chunk (NB_KPOS in _native/nbits.h)
_KPOS = tuple(2 * (j & 3) + (j >> 2) for j in range(8))


def _panelize(x: np.ndarray, out: np.ndarray, P: int, kb: int) -> None:
    """[N, kb] -> [P, kb, 16] (zero-padded columns) into ``out``."""
    N = x.shape[0]
    pad = np.zeros((16 * P, kb), np.float32)
    pad[:N] = x
    out.reshape(P, kb, 16)[...] = pad.reshape(P, 16, kb).transpose(0, 2, 1)


# **** numpy compute (the fallback when the extension is absent; also the tests' dequantizer) ****


def _block_params(p: PackedQ4) -> tuple[np.ndarray, np.ndarray]:
    """(scales, zero points) as float32 [kb, N]."""
    _, sc, zp = p.sections()
    kb = sc.shape[1]
    s = sc.transpose(1, 0, 2).reshape(kb, -1)[:, : p.N]
    if zp is None:
        z = np.full_like(s, 8.0)
    elif p.zp_kind == ZP_U4:
        z = np.stack([zp & 15, zp >> 4], axis=-1).transpose(1, 0, 2, 3).reshape(kb, -1)[:, : p.N].astype(np.float32)
    else:
        z = zp.transpose(1, 0, 2).reshape(kb, -1)[:, : p.N]
    return s, z


def _q_values(p: PackedQ4, b0: int, b1: int) -> np.ndarray:
    """Unsigned weights of blocks [b0, b1) as uint8 [(b1 - b0) * block_size, N]."""
    qw, _, _ = p.sections()
    cpb = p.block_size // 8
    w = qw[:, b0 * cpb: b1 * cpb, :]  # [P, c, 16]
    nib = np.stack([(w >> np.uint32(4 * _KPOS[j])) & np.uint32(15) for j in range(8)], axis=2)  # [P, c, 8, 16]
    return nib.astype(np.uint8).transpose(1, 2, 0, 3).reshape(-1, qw.shape[0] * 16)[:, : p.N]


def dequantize_q4(p: PackedQ4) -> np.ndarray:
    """The fp32 weight matrix ``W [K, N] = (q - zero_point) * scale``."""
    s, z = _block_params(p)
    bs = p.block_size
    q = _q_values(p, 0, s.shape[0]).astype(np.float32)
    w = (q - np.repeat(z, bs, axis=0)) * np.repeat(s, bs, axis=0)
    return w[: p.K]


def matmul_q4_numpy(a: np.ndarray, p: PackedQ4, int8: bool, panel_bytes: int = 8 << 20) -> np.ndarray:
    """``a [M, K] float32 -> y [M, N]``: fp32 (dequantized panels of K + BLAS) or onnxruntime's int8 scheme."""
    if int8:
        return _int8_numpy(a, p)
    s, z = _block_params(p)
    bs, kb = p.block_size, s.shape[0]
    step = max(1, panel_bytes // (4 * bs * p.N))
    y = np.zeros((a.shape[0], p.N), np.float32)
    for b0 in range(0, kb, step):
        b1 = min(kb, b0 + step)
        k0, k1 = b0 * bs, min(p.K, b1 * bs)
        w = _q_values(p, b0, b1).astype(np.float32)
        w -= np.repeat(z[b0:b1], bs, axis=0)
        w *= np.repeat(s[b0:b1], bs, axis=0)
        y += a[:, k0:k1] @ w[: k1 - k0]
    return y


def quantize_a_int8(a: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's CompInt8 quantization of A per block: (int8 values [M, kb, bs], scales [M, kb]).

    ``scale = amax / 127``; ``q = round_half_even(a * (127 / amax))`` (one division, as MLAS computes it);
    zero-padded past K.
    """
    M, K = a.shape
    kb = -(-K // block_size)
    pad = np.zeros((M, kb * block_size), np.float32)
    pad[:, :K] = a
    blocks = pad.reshape(M, kb, block_size)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(blocks * inv[:, :, None]).astype(np.int8)
    return q, (amax / np.float32(127.0)).astype(np.float32)


def _int8_numpy(a: np.ndarray, p: PackedQ4) -> np.ndarray:
    s, z = _block_params(p)
    bs, kb, M = p.block_size, s.shape[0], a.shape[0]
    q, ascale = quantize_a_int8(a, bs)
    qsum = q.astype(np.float32).sum(axis=2)  # [M, kb], exact
    w = _q_values(p, 0, kb).astype(np.float32).reshape(kb, bs, p.N)
    y = np.zeros((M, p.N), np.float32)
    rows = max(1, _NUMPY_CHUNK // max(1, kb * p.N))
    for m0 in range(0, M, rows):
        qa = q[m0: m0 + rows].astype(np.float32).transpose(1, 0, 2)  # [kb, m, bs]
        dot = np.matmul(qa, w)  # [kb, m, N]: integer-valued, exact in fp32 (|dot| < 2**24)
        f = dot - z[:, None, :] * qsum[m0: m0 + rows].T[:, :, None]
        y[m0: m0 + rows] = (f * (s[:, None, :] * ascale[m0: m0 + rows].T[:, :, None])).sum(axis=0)
    return y
