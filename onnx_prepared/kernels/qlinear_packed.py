"""Prepacked static-quantization kernels: the QOperator ops with constant quantization parameters (what
``quantize_static`` writes) bound to ``_native/qlinear.c``, each with its own layout key.

- QLinearConv and QGemm (``transA`` 0, a bias of one value per output): the weights centered once into
  int16 rows ``[M, Kp]`` (``w - w_zp``, per channel), the int32 bias and the float32 requantization
  scales (``x_scale * w_scale[m] / y_scale``, float32 as onnxruntime) in one :class:`PackedQLinear`;
  the run is one ``qconv`` call (QGemm is a 1x1 convolution of ``A^T``);
- QLinearAdd, QLinearMul, QLinearGlobalAveragePool, per-tensor QuantizeLinear and DequantizeLinear:
  the scalar scales and zero points as one float64 array, read once, so a run is a shape check and one
  native call.

Each call goes native when the extension is there and the inputs are what the packed form expects
(dtype, a 1-D or 2-D Conv, a supported broadcast); anything else runs the numpy kernels of
kernels/qlinear.py and kernels/quantize.py on the same values, so the outputs never depend on which
path ran (tests/kernels/test_qlinear_native.py checks both against onnxruntime).
"""

from __future__ import annotations

import math

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import native
from onnx_prepared.kernels import qlinear as Q
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.quantize import dequantize_linear, quantize_linear
from onnx_prepared.kernels.registry import kernel

_MS = "com.microsoft"
_Q8 = ("uint8", "int8")
_DTYPES = {n: np.dtype(n) for n in ("uint8", "int8", "float32")}


def _dtype(name: str) -> np.dtype:
    """``np.dtype(name)``, a dict read for the names the rules bind (np.dtype of a str is ~0.3 us)."""
    d = _DTYPES.get(name)
    return d if d is not None else np.dtype(name)
_YMODE = {"uint8": 0, "int8": 1, "float32": 2}
_F32 = np.dtype(np.float32)


class PackedQLinear:
    """Centered int16 weights ``[M, Kp]``, int32 bias ``[M]``, float32 scales ``[M]`` and the input and
    output zero points of a QLinearConv or QGemm; ``wc`` is the centered weight in its ONNX shape (a view,
    for the numpy path)."""

    __slots__ = ("bias", "nbytes", "scales", "w16", "wc", "zx", "zy")

    def __init__(self, w16: np.ndarray, bias: np.ndarray, scales: np.ndarray, zx: int, zy: int,
                 wshape: tuple[int, ...]):
        self.w16, self.bias, self.scales, self.zx, self.zy = w16, bias, scales, int(zx), int(zy)
        self.wc = w16[:, :math.prod(wshape[1:])].reshape(wshape)
        self.nbytes = w16.nbytes + bias.nbytes + scales.nbytes + 16

    def to_bytes(self) -> np.ndarray:
        return np.concatenate([self.w16.reshape(-1).view(np.uint8), self.bias.view(np.uint8),
                               self.scales.view(np.uint8), np.array([self.zx, self.zy], np.int64).view(np.uint8)])

    @staticmethod
    def reader(m: int, kp: int, wshape: tuple[int, ...]):
        def from_bytes(buf: np.ndarray) -> PackedQLinear:
            o1, o2, o3 = 2 * m * kp, 2 * m * kp + 4 * m, 2 * m * kp + 8 * m
            zx, zy = (int(v) for v in buf[o3:o3 + 16].view(np.int64))
            return PackedQLinear(buf[:o1].view(np.int16).reshape(m, kp), buf[o1:o2].view(np.int32),
                                 buf[o2:o3].view(np.float32), zx, zy, wshape)

        return from_bytes


def _centered(w: np.ndarray, zw: np.ndarray) -> np.ndarray:
    """``w - zw`` (per row) as int16 ``[M, Kp]``, K = prod(w.shape[1:]) rounded up to even, zero past K."""
    m = w.shape[0]
    k = math.prod(w.shape[1:])
    w16 = np.zeros((m, k + k % 2), np.int16)
    w16[:, :k] = w.reshape(m, k).astype(np.int32) - np.broadcast_to(zw.reshape(-1, 1), (m, 1))
    return w16


def _per_row(v: np.ndarray, m: int) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.float32).reshape(-1), (m,)))


def _bias32(b: np.ndarray | None, m: int) -> np.ndarray:
    return np.zeros(m, np.int32) if b is None else np.ascontiguousarray(b.reshape(-1), np.int32)


def _all_const(positions, const_inputs, const_shapes) -> bool:
    return const_inputs.issuperset(positions) and all(map(const_shapes.__contains__, positions))


# ---- QLinearConv ----

def _pack_conv(xs, xzp, w, ws, wzp, ys, yzp, b=None) -> PackedQLinear:
    m = w.shape[0]
    zw = Q._per_channel(wzp, m, "w_zero_point", np.int64)
    if np.any(zw != zw[0]):
        raise KernelError("QLinearConv: per-channel weight zero points must all be equal (onnxruntime requires it)")
    scales = (np.float32(Q._scalar(xs, "x_scale")) * Q._per_channel(ws, m, "w_scale", np.float32)
              / np.float32(Q._scalar(ys, "y_scale"))).astype(np.float32)
    return PackedQLinear(_centered(w, zw), _bias32(b, m), _per_row(scales, m), int(Q._scalar(xzp, "x_zero_point")),
                         int(Q._scalar(yzp, "y_zero_point")), tuple(w.shape))


class QConv:
    """The packed QLinearConv call: per input shape a plan (the ``qconv`` dims, the output shape and, for one
    group with int8-range weights, ``qconv_vnni``'s 8-bit blocks) built once; 1-D and 2-D convolutions of
    the packed input type go native (``qconv_vnni`` at AVX-512 VNNI, else ``qconv``: the same bits), the
    rest through :func:`qlinear.conv_accumulate`. Thread-safe: plans are immutable."""

    __slots__ = ("_plans", "attrs", "group", "kshape", "xdtype", "ydtype")

    def __init__(self, kshape: tuple[int, ...], group: int, xdtype: str, ydtype: str, attrs: dict):
        self.kshape, self.group, self.attrs = kshape, group, attrs
        self.xdtype, self.ydtype = _dtype(xdtype), _dtype(ydtype)
        self._plans: dict = {}

    def __call__(self, packed: PackedQLinear, x: np.ndarray, *omitted) -> tuple:
        key = (x.shape, x.dtype)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(packed, x) or False
        if plan and native._ext is plan[0]:
            y = np.empty(plan[1], self.ydtype)
            x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            w8 = plan[3]
            if w8 is not None and w8[0] is packed.w16:
                if plan[0].qconv_vnni(x, w8[1], w8[2], packed.scales, y, plan[2]):
                    return (y,)
            elif w8 is not None:  # another packed object (reloaded): its own 8-bit panels
                self._plans[key] = plan = (*plan[:3], _vnni_panels(packed, self.group, x))
                return self(packed, x)
            plan[0].qconv(x, packed.w16, packed.bias, packed.scales, y, plan[2])
            return (y,)
        return (self._numpy(packed, x),)

    def _plan(self, packed: PackedQLinear, x: np.ndarray):
        ext = native._ext
        if ext is None or x.dtype != self.xdtype or x.ndim not in (3, 4) or len(self.kshape) != x.ndim - 2:
            return None
        g, m = self.group, packed.w16.shape[0]
        if g < 1 or x.shape[1] % g or m % g or x.shape[1] // g != packed.wc.shape[1] or not x.size:
            return None
        a = self.attrs
        try:
            begins, _, out = sp.geometry("Conv", x.shape[2:], self.kshape, auto_pad=a.get("auto_pad", "NOTSET"),
                                         pads=a.get("pads"), strides=a.get("strides"), dilations=a.get("dilations"))
            strides = sp.ints(a.get("strides"), x.ndim - 2, 1, "strides", "QLinearConv")
            dilations = sp.ints(a.get("dilations"), x.ndim - 2, 1, "dilations", "QLinearConv")
        except Exception:  # the numpy path reports it
            return None
        if min(out) < 1:
            return None
        if x.ndim == 3:  # a 1-D convolution as one image row
            hw, ks, out, begins = (1, x.shape[2]), (1, self.kshape[0]), (1, out[0]), (0, begins[0])
            strides, dilations = (1, strides[0]), (1, dilations[0])
        else:
            hw, ks = x.shape[2:], self.kshape
        n, c = x.shape[:2]
        dims = np.array([n, c, *hw, g, m // g, *ks, *out, *begins, *strides, *dilations, packed.zx, packed.zy,
                         int(x.dtype == np.int8), _YMODE[self.ydtype.name]], np.int64)
        w8 = _vnni_panels(packed, g, x) if hasattr(ext, "qconv_vnni") else None
        return ext, (n, m, *out[2 - (x.ndim - 2):]), dims, w8

    def _numpy(self, packed: PackedQLinear, x: np.ndarray) -> np.ndarray:
        a = self.attrs
        acc = Q.conv_accumulate(x, packed.zx, packed.wc, 0, self.group, self.kshape,
                                auto_pad=a.get("auto_pad", "NOTSET"), dilations=a.get("dilations"),
                                pads=a.get("pads"), strides=a.get("strides"))
        nd = acc.ndim - 2
        acc += packed.bias.astype(np.int64).reshape((-1,) + (1,) * nd)
        return Q.requantize(acc.astype(np.int32), packed.scales.reshape((-1,) + (1,) * nd), packed.zy, self.ydtype)


def _vnni_panels(packed: PackedQLinear, group: int, x: np.ndarray):
    """``(packed.w16, blocks, badj)`` for ``qconv_vnni`` (qconv_vnni.c): the centered weights as int8 blocks of
    8 output channels ``[ceil(M/8), C4/4 * KH * KW, 8, 4]`` (k-quads of 4 channels at one tap, zero past C
    and M) and ``bias - zx * sum(w)`` per channel (int32, wrapping as the sums; zx moved by +128 for an
    int8 ``x``, as the kernel moves x); None for several groups or weights outside int8 (qconv's int16
    path)."""
    wc = packed.wc
    if group != 1 or wc.size == 0 or int(wc.min()) < -128 or int(wc.max()) > 127:
        return None
    m, c = wc.shape[:2]
    kk = math.prod(wc.shape[2:])
    cq = -(-c // 4)
    mb = -(-m // 8)
    w = np.zeros((mb * 8, cq * 4, kk), np.int8)
    w[:m, :c] = wc.reshape(m, c, kk)
    blocks = np.ascontiguousarray(w.reshape(mb, 8, cq, 4, kk).transpose(0, 2, 4, 1, 3))
    wsum = wc.reshape(m, -1).sum(axis=1, dtype=np.int64)
    zx = packed.zx + 128 if x.dtype == np.int8 else packed.zx
    badj = ((packed.bias.astype(np.int64) - zx * wsum) % (1 << 32)).astype(np.uint32).view(np.int32)
    return packed.w16, blocks, np.ascontiguousarray(badj)


_CONV_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
_CONV_SOURCES = {8: tuple(range(1, 8)), 9: tuple(range(1, 9))}  # inputs present -> the packed positions


@prepack_rule("QLinearConv")
def qlinear_conv_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    ins = node.input
    n = len(ins)
    while n and not ins[n - 1]:  # trailing omitted inputs
        n -= 1
    sources = _CONV_SOURCES.get(n)
    if sources is None or 0 in const_inputs or not all(ins[:n]):
        return None
    if not _all_const(sources, const_inputs, const_shapes) or not attrs.keys() <= _CONV_ATTRS:
        return None
    wshape, wdtype = const_shapes[3]
    wshape = tuple(map(int, wshape))
    xdtype, ydtype = const_shapes[2][1], const_shapes[7][1]
    group = int(attrs.get("group", 1))
    if wdtype not in _Q8 or xdtype not in _Q8 or ydtype not in _Q8 or len(wshape) < 3 or group < 1:
        return None
    kshape = wshape[2:]
    if attrs.get("kernel_shape") and tuple(attrs["kernel_shape"]) != kshape:
        return None  # the unpacked kernel reports the mismatch
    m, k = wshape[0], math.prod(wshape[1:])
    kp = k + k % 2
    kw = {n: attrs[n] for n in ("auto_pad", "dilations", "pads", "strides") if n in attrs} if attrs else {}
    layout = (f"qconv-w16-{wdtype}-x{xdtype}-y{ydtype}-m{m}-c{wshape[1]}-k{'x'.join(map(str, kshape))}"
              f"-b{int(n == 9)}")
    return PrepackSpec(sources, layout, _pack_conv, QConv(kshape, group, xdtype, ydtype, kw), PackedQLinear.to_bytes,
                       PackedQLinear.reader(m, kp, wshape), packed_bytes=2 * m * kp + 8 * m + 16)


# ---- QGemm ----

class QGemm:
    """The packed QGemm call: ``A [M, K]`` as the image ``[1, K, 1, M]`` of a 1x1 ``qconv`` (float32 out
    when the node has no y_scale), or the exact float64 product of kernels/qlinear.py."""

    __slots__ = ("_dims", "adtype", "ydtype")

    def __init__(self, adtype: str, ydtype: str):
        self.adtype, self.ydtype = _dtype(adtype), _dtype(ydtype)
        self._dims: dict = {}  # (M, K, N, zx, zy) -> the qconv dims, built once (~1 us a call; qconv only reads them)

    def __call__(self, packed: PackedQLinear, a: np.ndarray, *omitted) -> tuple:
        if a.ndim != 2 or a.shape[1] != packed.wc.shape[1]:
            raise KernelError(f"QGemm needs a 2-D A of {packed.wc.shape[1]} columns, got {a.shape}")
        ext = native._ext
        m, k = a.shape
        n = packed.w16.shape[0]
        if ext is None or a.dtype != self.adtype or not a.size:
            return (self._numpy(packed, a),)
        x = a.reshape(1, k, 1, 1) if m == 1 else np.ascontiguousarray(a.T).reshape(1, k, 1, m)
        key = (m, k, n, packed.zx, packed.zy)
        dims = self._dims.get(key)
        if dims is None:
            dims = self._dims[key] = np.array([1, k, 1, m, 1, n, 1, 1, 1, m, 0, 0, 1, 1, 1, 1, packed.zx, packed.zy,
                                               int(a.dtype == np.int8), _YMODE[self.ydtype.name]], np.int64)
        y = np.empty((n, m), self.ydtype)
        ext.qconv(x if x.flags.c_contiguous else np.ascontiguousarray(x), packed.w16, packed.bias, packed.scales, y,
                  dims)
        return (y.reshape(1, n) if m == 1 else np.ascontiguousarray(y.T),)

    def _numpy(self, packed: PackedQLinear, a: np.ndarray) -> np.ndarray:
        acc = np.rint((a.astype(np.float64) - packed.zx) @ packed.wc.astype(np.float64).T).astype(np.int64)
        acc = (acc + packed.bias).astype(np.int32)
        if self.ydtype == np.float32:
            return (acc.astype(np.float32) * packed.scales).astype(np.float32)
        return Q.requantize(acc, packed.scales, packed.zy, self.ydtype)


@prepack_rule("QGemm", domain=_MS)
def qgemm_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    names = list(node.input) + [""] * (9 - len(node.input))
    if 0 in const_inputs or not all(names[:6]) or int(attrs.get("transA", 0)) or set(attrs) - {"alpha", "transA",
                                                                                                "transB"}:
        return None
    sources = tuple(i for i in range(1, 9) if names[i])
    if not _all_const(sources, const_inputs, const_shapes) or (names[8] and not names[7]):
        return None
    bshape, bdtype = const_shapes[3]
    adtype = const_shapes[2][1]
    trans_b, alpha = int(attrs.get("transB", 0)), float(attrs.get("alpha", 1.0))
    if bdtype not in _Q8 or adtype not in _Q8 or len(bshape) != 2:
        return None
    k, n = (int(bshape[1]), int(bshape[0])) if trans_b else (int(bshape[0]), int(bshape[1]))
    if names[6] and math.prod(const_shapes[6][0]) != n:
        return None  # a [M, N] C: the numpy kernel
    ydtype = const_shapes[8][1] if names[8] else ("uint8" if names[7] else "float32")
    if ydtype not in _YMODE:
        return None
    pos = {p: i for i, p in enumerate(sources)}

    def pack(*arrays) -> PackedQLinear:
        def at(p):
            return arrays[pos[p]] if p in pos else None

        b = at(3).T if trans_b else at(3)
        zb = Q._per_channel(at(5), n, "b_zero_point", np.int64)
        sb = Q._per_channel(at(4), n, "b_scale", np.float32)
        scales = np.float32(np.float32(alpha) * np.float32(Q._scalar(at(1), "a_scale"))) * sb
        if at(7) is not None:
            scales = scales / np.float32(Q._scalar(at(7), "y_scale"))
        zy = int(Q._scalar(at(8), "y_zero_point")) if at(8) is not None else 0
        return PackedQLinear(_centered(np.ascontiguousarray(b.T), zb), _bias32(at(6), n), _per_row(scales, n),
                             int(Q._scalar(at(2), "a_zero_point")), zy, (n, k))

    kp = k + k % 2
    layout = f"qgemm-w16-{bdtype}-a{adtype}-y{ydtype}-n{n}-k{k}-t{trans_b}-alpha{alpha!r}-c{int(bool(names[6]))}"
    return PrepackSpec(sources, layout, pack, QGemm(adtype, ydtype), PackedQLinear.to_bytes,
                       PackedQLinear.reader(n, kp, (n, k)), packed_bytes=2 * n * kp + 8 * n + 16)


# ---- scalar-parameter ops ----

def _params(*arrays) -> np.ndarray:
    """The scalar scales and zero points, in order, as float64 (every float32 and 8-bit value exactly)."""
    out = np.empty(len(arrays), np.float64)
    for i, a in enumerate(arrays):
        if a.size != 1:
            raise KernelError(f"quantization parameter {i} must be a scalar, got shape {a.shape}")
        out[i] = a.reshape(-1)[0]
    return out


def _read_params(count: int):
    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(np.float64)[:count]

    return from_bytes


def _scalar_shapes(positions, const_shapes) -> bool:
    for p in positions:
        dims = const_shapes[p][0]
        if dims and math.prod(dims) != 1:  # () is a scalar
            return False
    return True


def _span(full: tuple[int, ...], part: tuple[int, ...]) -> int:
    """The span ``part`` is constant over when it is ``full[:k] + (1,) * (rank - k)`` (0 when it is not)."""
    if len(part) > len(full):
        return 0
    p = (1,) * (len(full) - len(part)) + tuple(part)
    k = len(full)
    while k > 0 and p[k - 1] == 1:
        k -= 1
    if p[:k] != full[:k]:
        return 0
    return math.prod(full[k:])


class QBinary:
    """Packed QLinearAdd (op 0) / QLinearMul (op 1): ``[sa, za, sb, zb, sc, zc]`` packed; equal shapes or
    one operand constant over spans of the other go native (the full operand first, as onnxruntime passes
    it), other broadcasts through the numpy kernel."""

    __slots__ = ("_derived", "_shapes", "dtype", "op")

    def __init__(self, op: int, dtype: str):
        self.op, self.dtype = op, _dtype(dtype)
        self._derived = None
        # (a's shape, b's shape) -> (swap, qbinary dims) or None for the numpy kernel: the broadcast
        # worked out once per shape pair (~1 us a call); qbinary only reads the dims
        self._shapes: dict = {}

    def _derive(self, packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = self._derived
        if d is not None and d[0] is packed:
            return d[1], d[2]
        sa, za, sb, zb, sc, zc = (float(v) for v in packed)
        za, zb, zc = int(za), int(zb), int(zc)
        if self.op == 0:
            fused = Q._fused()
            p1 = np.array([*Q.add_params(sa, za, sb, zb, sc, zc, fused), 0, 0], np.float64)
            p2 = np.array([*Q.add_params(sb, zb, sa, za, sc, zc, fused), 0, 0], np.float64)
        else:
            p1 = np.array([Q.mul_ratio(sa, sb, sc), zc, 0, za, zb], np.float64)
            p2 = np.array([Q.mul_ratio(sa, sb, sc), zc, 0, zb, za], np.float64)
        self._derived = (packed, p1, p2)
        return p1, p2

    def __call__(self, packed: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple:
        ext = native._ext
        if ext is not None and a.dtype == self.dtype and b.dtype == self.dtype and a.size and b.size:
            key = (a.shape, b.shape)
            plan = self._shapes.get(key, False)
            if plan is False:
                plan = self._shapes[key] = self._plan(a, b)
            if plan is not None:
                swap, dims = plan
                p1, p2 = self._derive(packed)
                if swap:
                    a, b = b, a
                y = np.empty(a.shape, self.dtype)
                ext.qbinary(a if a.flags.c_contiguous else np.ascontiguousarray(a),
                            b if b.flags.c_contiguous else np.ascontiguousarray(b), y, dims, p2 if swap else p1)
                return (y,)
        sa, za, sb, zb, sc, zc = (np.array(v, t) for v, t in zip(
            packed, (np.float32, self.dtype, np.float32, self.dtype, np.float32, self.dtype)))
        fn = Q.qlinear_add if self.op == 0 else Q.qlinear_mul
        return fn(a, sa, za, b, sb, zb, sc, zc)


    def _plan(self, a: np.ndarray, b: np.ndarray) -> tuple[bool, np.ndarray] | None:
        swap = False
        if a.shape == b.shape:
            bmode, span = 0, 1
        else:
            span, bmode = _span(a.shape, b.shape), 1
            if not span:
                span, swap = _span(b.shape, a.shape), True
        if not span:
            return None
        fused = int(self.op == 0 and Q._fused())
        return swap, np.array([max(a.size, b.size), span, bmode, int(self.dtype == np.int8), self.op, fused], np.int64)


def _binary_rule(op: int):
    def rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
        names = list(node.input)
        if len(names) != 8 or not all(names) or attrs or {0, 3} & set(const_inputs):
            return None
        sources = (1, 2, 4, 5, 6, 7)
        if not _all_const(sources, const_inputs, const_shapes) or not _scalar_shapes(sources, const_shapes):
            return None
        dtype = const_shapes[2][1]
        if dtype not in _Q8 or const_shapes[5][1] != dtype or const_shapes[7][1] != dtype:
            return None
        return PrepackSpec(sources, f"qparams-{('add', 'mul')[op]}-{dtype}", lambda *p: _params(*p),
                           QBinary(op, dtype), array_to_bytes, _read_params(6))

    return rule


prepack_rule("QLinearAdd", domain=_MS)(_binary_rule(0))
prepack_rule("QLinearMul", domain=_MS)(_binary_rule(1))


class QGap:
    """Packed QLinearGlobalAveragePool (channels first): ``[sx, zx, sy, zy]`` packed, the scale per plane
    size computed once."""

    __slots__ = ("_plans", "dtype")

    def __init__(self, dtype: str):
        self.dtype = _dtype(dtype)
        self._plans: dict = {}

    def __call__(self, packed: np.ndarray, x: np.ndarray, *omitted) -> tuple:
        ext = native._ext
        if ext is None or x.dtype != self.dtype or x.ndim < 3 or not x.size:
            return self._numpy(packed, x)
        plan = self._plans.get(x.shape)
        if plan is None or plan[0] is not packed:
            sx, zx, sy, zy = (float(v) for v in packed)
            size = math.prod(x.shape[2:])
            scale = np.float32(np.float32(sx) / np.float32(np.float32(sy) * np.float32(size)))
            if size >= 1 << 24 or not (2.0 ** -32 <= scale < 256.0):
                return self._numpy(packed, x)  # it reports the problem
            n, c = x.shape[:2]
            plan = self._plans[x.shape] = (packed, (n, c) + (1,) * (x.ndim - 2),
                                           np.array([n * c, size, int(zx), int(zy), int(self.dtype == np.int8)],
                                                    np.int64), float(scale))
        y = np.empty(plan[1], self.dtype)
        ext.qgap(x if x.flags.c_contiguous else np.ascontiguousarray(x), y, plan[2], plan[3])
        return (y,)

    def _numpy(self, packed: np.ndarray, x: np.ndarray) -> tuple:
        sx, zx, sy, zy = packed
        return Q.qlinear_global_average_pool(x, np.float32(sx), np.array(zx, self.dtype), np.float32(sy),
                                             np.array(zy, self.dtype))


@prepack_rule("QLinearGlobalAveragePool", domain=_MS)
def qlinear_gap_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    names = list(node.input)
    if len(names) != 5 or not all(names) or 0 in const_inputs or int(attrs.get("channels_last", 0)):
        return None
    sources = (1, 2, 3, 4)
    if not _all_const(sources, const_inputs, const_shapes) or not _scalar_shapes(sources, const_shapes):
        return None
    dtype = const_shapes[2][1]
    if dtype not in _Q8 or const_shapes[4][1] != dtype:
        return None
    return PrepackSpec(sources, f"qparams-gap-{dtype}", lambda *p: _params(*p), QGap(dtype), array_to_bytes,
                       _read_params(4))


class QuantizeF32:
    """Packed per-tensor QuantizeLinear of float32 into 8 bits: ``[scale, zero point]`` packed."""

    __slots__ = ("_args", "dtype", "has_zp")

    def __init__(self, dtype: str, has_zp: bool):
        self.dtype, self.has_zp = _dtype(dtype), has_zp
        self._args: tuple = (None,)  # (packed, zero point, signed, scale): the call's scalars, read once

    def __call__(self, packed: np.ndarray, x: np.ndarray, *omitted) -> tuple:
        ext = native._ext
        if ext is not None and x.dtype == _F32:
            a = self._args
            if a[0] is not packed:
                a = self._args = (packed, int(packed[1]), int(self.dtype == np.int8), float(packed[0]))
            y = np.empty(x.shape, self.dtype)
            ext.quantize_f32(x if x.flags.c_contiguous else np.ascontiguousarray(x), y, a[1], a[2], a[3])
            return (y,)
        zp = np.array(packed[1], self.dtype) if self.has_zp else None
        return quantize_linear(x, np.array(packed[0], np.float32), zp,
                               output_dtype=0 if self.has_zp else (2 if self.dtype == np.uint8 else 3))


@prepack_rule("QuantizeLinear")
def quantize_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    names = list(node.input)
    if 0 in const_inputs or len(names) not in (2, 3) or not names[1] or set(attrs) - {"axis", "output_dtype",
                                                                                      "saturate"}:
        return None
    sources = (1, 2) if len(names) == 3 and names[2] else (1,)
    if not _all_const(sources, const_inputs, const_shapes) or not _scalar_shapes(sources, const_shapes):
        return None
    if const_shapes[1][1] != "float32":
        return None
    out = {2: "uint8", 3: "int8"}.get(int(attrs.get("output_dtype", 0)), "") if attrs.get("output_dtype") else ""
    dtype = const_shapes[2][1] if len(sources) == 2 else (out or "uint8")
    if dtype not in _Q8 or (out and out != dtype):
        return None
    return PrepackSpec(sources, f"qparams-quantize-{dtype}", lambda s, z=None: _params(s, z if z is not None else
                                                                                        np.zeros(1)),
                       QuantizeF32(dtype, len(sources) == 2), array_to_bytes, _read_params(2))


class DequantizeF32:
    """Packed per-tensor DequantizeLinear of 8 bits into float32: ``[scale, zero point]`` packed."""

    __slots__ = ("_args", "dtype")

    def __init__(self, dtype: str):
        self.dtype = _dtype(dtype)
        self._args: tuple = (None,)  # (packed, zero point, signed, scale): the call's scalars, read once

    def __call__(self, packed: np.ndarray, x: np.ndarray, *omitted) -> tuple:
        ext = native._ext
        if ext is not None and x.dtype == self.dtype:
            a = self._args
            if a[0] is not packed:
                a = self._args = (packed, int(packed[1]), int(self.dtype == np.int8), float(packed[0]))
            y = np.empty(x.shape, _F32)
            ext.dequantize_f32(x if x.flags.c_contiguous else np.ascontiguousarray(x), y, a[1], a[2], a[3])
            return (y,)
        return dequantize_linear(x, np.array(packed[0], np.float32), np.array(packed[1], self.dtype))


@prepack_rule("DequantizeLinear")
def dequantize_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    names = list(node.input)
    if 0 in const_inputs or len(names) != 3 or not all(names) or set(attrs) - {"axis"}:
        return None
    sources = (1, 2)
    if not _all_const(sources, const_inputs, const_shapes) or not _scalar_shapes(sources, const_shapes):
        return None
    dtype = const_shapes[2][1]
    if const_shapes[1][1] != "float32" or dtype not in _Q8:
        return None
    return PrepackSpec(sources, f"qparams-dequantize-{dtype}", lambda *p: _params(*p), DequantizeF32(dtype),
                       array_to_bytes, _read_params(2))


# ---- onnx_prepared::QLookup ----

#: the float ops a lookup tabulates (resolve/fusions_qdq.py: the ones onnxruntime leaves between a
#: DequantizeLinear and a QuantizeLinear), with their attributes' defaults
LOOKUP_OPS = {"Relu": {}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}}


def _table(xdtype: np.dtype, xs, xz, ys, yz, function: str, attrs: dict) -> np.ndarray:
    """``QuantizeLinear(function(DequantizeLinear(v)))`` for the 256 values ``v`` of ``xdtype``, by byte,
    through the same kernels the unfused chain runs (elementwise, so the same values)."""
    from onnx_prepared.kernels import activation

    if function not in LOOKUP_OPS or xdtype not in (np.uint8, np.int8):
        raise KernelError(f"QLookup: cannot tabulate {function!r} of {xdtype}")
    v = np.arange(256, dtype=np.uint8).view(xdtype)
    (f,) = dequantize_linear(v, np.asarray(xs, np.float32), np.asarray(xz, xdtype))
    fn = activation.relu if function == "Relu" else activation.hard_sigmoid
    (g,) = fn(f, **{k: float(attrs.get(k, d)) for k, d in LOOKUP_OPS[function].items()})
    (q,) = quantize_linear(np.asarray(g, np.float32), np.asarray(ys, np.float32), np.asarray(yz))
    return np.ascontiguousarray(q.view(np.uint8))


def _lookup(table: np.ndarray, x: np.ndarray, ydtype: np.dtype) -> np.ndarray:
    ext = native._ext
    if ext is not None and x.dtype in (np.uint8, np.int8):
        y = np.empty(x.shape, ydtype)
        ext.qlookup(x if x.flags.c_contiguous else np.ascontiguousarray(x), table, y)
        return y
    return table[x.view(np.uint8)].view(ydtype)


@kernel("QLookup", since=1, domain="onnx_prepared")
def q_lookup(x, x_scale, x_zero_point, y_scale, y_zero_point, *, function: str, alpha: float = 0.2,
             beta: float = 0.5) -> tuple[np.ndarray]:
    """``QuantizeLinear(function(DequantizeLinear(x)))`` by a 256-entry table (per-tensor parameters)."""
    function = function.decode() if isinstance(function, bytes) else function
    table = _table(x.dtype, x_scale, x_zero_point, y_scale, y_zero_point, function, {"alpha": alpha, "beta": beta})
    return (_lookup(table, x, y_zero_point.dtype),)


class QLookupPacked:
    __slots__ = ("ydtype",)

    def __init__(self, ydtype: str):
        self.ydtype = _dtype(ydtype)

    def __call__(self, table: np.ndarray, x: np.ndarray, *omitted) -> tuple:
        return (_lookup(table, x, self.ydtype),)


@prepack_rule("QLookup", domain="onnx_prepared")
def q_lookup_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    names = list(node.input)
    sources = (1, 2, 3, 4)
    if len(names) != 5 or 0 in const_inputs or not _all_const(sources, const_inputs, const_shapes):
        return None
    xdtype, ydtype = const_shapes[2][1], const_shapes[4][1]
    function = attrs.get("function")
    if isinstance(function, bytes):
        function = function.decode()
    if xdtype not in _Q8 or ydtype not in _Q8 or function not in LOOKUP_OPS:
        return None
    extra = {k: float(attrs[k]) for k in LOOKUP_OPS[function] if k in attrs}

    def pack(xs, xz, ys, yz) -> np.ndarray:
        return _table(np.dtype(xdtype), xs, xz, ys, yz, function, extra)

    layout = f"qlookup-{function}-{xdtype}-{ydtype}-" + "-".join(f"{k}{v!r}" for k, v in sorted(extra.items()))
    return PrepackSpec(sources, layout, pack, QLookupPacked(ydtype), array_to_bytes, lambda buf: buf[:256])
