"""Prepacked Conv with a constant weight, in one of two layouts (each its own layout key):

- ``conv-w-p16``: float32 work dtype with more than one input channel per group: the GEMM matrix
  ``[g, M/g, C/g*prod(k)]`` as 16-row K-major panels (``native.pack_panels``), read by the prepacked
  SGEMM (``sgemm.c``) that streams the weights once per call;
- ``conv-w-gmk``: the plain contiguous matrix (one-channel groups, which run depthwise, and float64).

Both are in the compute dtype (float16 weights are widened to float32 once, at packing, instead of on
every run). The layout key names everything that changes those bytes: group, the matrix dimensions,
the kernel shape, the source and packed dtypes.
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import native
from onnx_prepared.kernels.conv import conv_core, weight_matrix
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule

#: Conv attributes the packed kernel understands (any other attribute: no prepack, the binder decides).
_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
_DTYPES = frozenset({"float16", "float32", "float64"})


def conv_packed(packed: np.ndarray, x: np.ndarray, b: np.ndarray | None = None, *, kshape: tuple[int, ...],
                auto_pad: str = "NOTSET", dilations=None, group: int = 1, pads=None, strides=None,
                panel_rows: int | None = None, lo: float = -np.inf, hi: float = np.inf, act: int = 0,
                alpha: float = 0.0) -> tuple:
    return (conv_core(x, packed, b, kshape, auto_pad=auto_pad, dilations=dilations, group=group, pads=pads,
                      strides=strides, panel_rows=panel_rows, lo=lo, hi=hi, act=act, alpha=alpha),)


class PackedConv:
    """:func:`conv_packed` with its geometry settled once per input shape: a float32 4-D input whose
    Conv the extension runs as one depthwise call, one packed SGEMM (1x1) or im2col + packed SGEMM gets a
    plan (the output shape and the int64 dims arrays built once) and each later call of that shape only
    allocates the output and calls the extension (a unit-stride kernel: :func:`_direct`; a batch of small
    planes: :func:`_merged`). Anything
    else (other dtypes, ranks, no extension) goes through :func:`conv_core` as before. Thread-safe:
    plans are immutable and a race only builds one twice."""

    __slots__ = ("_plain", "_plans", "attrs", "group", "kshape", "panel_rows")

    def __init__(self, *, kshape: tuple[int, ...], group: int, panel_rows: int | None = None, **attrs):
        self.kshape, self.group, self.panel_rows, self.attrs = kshape, group, panel_rows, attrs
        self._plans: dict = {}
        self._plain = self.with_epilogue()  # a Conv node's own call: no epilogue

    def __call__(self, packed: np.ndarray, x: np.ndarray, b: np.ndarray | None = None, **epilogue) -> tuple:
        if not epilogue:
            return self._plain(packed, x, b)
        return self._with(packed, x, b, **epilogue)

    def _with(self, packed: np.ndarray, x: np.ndarray, b: np.ndarray | None = None, *, lo: float = -np.inf,
              hi: float = np.inf, act: int = 0, alpha: float = 0.0) -> tuple:
        key = (x.shape, x.dtype, None if b is None else (b.shape, b.dtype), lo, hi, act, alpha)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(packed, x, b, lo, hi, act, alpha) or False
        if plan and native._ext is plan[0]:
            return (plan[1](packed, x, b),)
        return conv_packed(packed, x, b, kshape=self.kshape, group=self.group, panel_rows=self.panel_rows, lo=lo,
                           hi=hi, act=act, alpha=alpha, **self.attrs)

    def native_plans(self) -> int:
        """How many input shapes this Conv runs as one extension plan (its own call's and the kwargs' calls';
        diagnostics and tests)."""
        return sum(1 for p in self._plans.values() if p) + self._plain.native_plans()

    def with_epilogue(self, lo: float = -np.inf, hi: float = np.inf, act: int = 0, alpha: float = 0.0, *,
                      folded: bool = False, residual: bool = False) -> EpilogueConv:
        """This Conv's call with a fused epilogue (and, with ``folded``, a :class:`FoldedConv`-style packed
        object carrying ``.w`` and ``.b``) settled at binding; with ``residual`` (a clip only, ``act`` 0) a
        :class:`ResidualConv`, whose last input is added before the clip."""
        if residual:
            if act:
                raise ValueError("a residual Conv's epilogue is a clip (act 0)")
            return ResidualConv(self, float(lo), float(hi), 0, 0.0, folded)
        return EpilogueConv(self, float(lo), float(hi), int(act), float(alpha), folded)

    def _plan(self, packed: np.ndarray, x: np.ndarray, b: np.ndarray | None, lo: float, hi: float, act: int,
              alpha: float = 0.0, residual: bool = False):
        """(extension, fn) for this input shape, or None: ``fn(packed, x, b)``; with ``residual`` (extension,
        fn, output shape), ``fn(packed, x, b, r)`` computing ``clip(conv + r)`` (r float32, C-contiguous, of
        the output's shape)."""
        if residual:
            return self._residual_plan(packed, x, b, lo, hi)
        ext = native._ext
        if ext is None or x.dtype != np.float32 or x.ndim != 4 or len(self.kshape) != 2 or not x.size:
            return None
        n, c, h, w = x.shape
        g, kshape, a = self.group, self.kshape, self.attrs
        cg = c // g if g >= 1 and c % g == 0 else 0
        try:
            begins, ends, out = sp.geometry("Conv", x.shape[2:], kshape, auto_pad=a.get("auto_pad", "NOTSET"),
                                            pads=a.get("pads"), strides=a.get("strides"),
                                            dilations=a.get("dilations"))
            strides = sp.ints(a.get("strides"), 2, 1, "strides", "Conv")
            dilations = sp.ints(a.get("dilations"), 2, 1, "dilations", "Conv")
        except Exception:  # conv_core reports it
            return None
        if not cg or min(out) < 1:
            return None
        lo, hi, act, alpha = float(lo), float(hi), int(act), float(alpha)
        p = out[0] * out[1]
        if self.panel_rows is None:  # conv-w-gmk: depthwise when one channel per group
            if cg != 1 or kshape[1] > 64:
                return None
            mult = int(packed.shape[1])  # [g, M/g, K]
            m = c * mult
            if packed.shape[0] != c or not packed.flags.c_contiguous:
                return None
            if b is not None and (b.shape != (m,) or b.dtype != np.float32):
                return None
            dims = np.array([n, c, h, w, mult, *kshape, *out, *begins, *strides, *dilations], np.int64)
            yshape = (n, m, *out)

            def depthwise(packed, x, b):
                y = np.empty(yshape, np.float32)
                ext.depthwise2d(x if x.flags.c_contiguous else np.ascontiguousarray(x), packed, b, y, dims, lo, hi,
                                act, alpha)
                return y

            return ext, depthwise
        mg = self.panel_rows
        m, cgk = g * mg, cg * sp.prod(kshape)
        if b is not None and (b.shape != (m,) or b.dtype != np.float32):
            return None  # other biases: conv_core
        yshape = (n, m, *out)
        if _direct(ext, kshape, strides, dilations, begins, ends, out, mg):
            ddims = np.array([n, c, h, w, g, mg, *kshape, *out, *begins], np.int64)

            def direct(packed, x, b):
                y = np.empty(yshape, np.float32)
                ext.conv_direct(x if x.flags.c_contiguous else np.ascontiguousarray(x), packed, b, y, ddims, lo, hi,
                                act, alpha)
                return y

            return ext, direct
        if n > 1 and p < 256 and g * mg * cgk >= _MERGE_MIN_WEIGHTS:
            return ext, _merged(ext, yshape, kshape, strides, begins, ends, dilations, g, mg, cgk, c, h, w, lo, hi, act,
                                alpha)
        gdims = np.array([g, mg, cgk, p, n], np.int64)
        if kshape == (1, 1) and tuple(strides) == (1, 1) and not any(begins) and not any(ends):
            def pointwise(packed, x, b):
                y = np.empty(yshape, np.float32)
                ext.sgemm_packed(packed, x if x.flags.c_contiguous else np.ascontiguousarray(x), y, b, gdims, lo, hi,
                                 act, alpha)
                return y

            return ext, pointwise
        cshape = (n, g, cgk, p)
        idims = np.array([n, c, h, w, g, *kshape, *out, *begins, *strides, *dilations, 0], np.int64)

        def im2col(packed, x, b):
            cols = np.empty(cshape, np.float32)
            ext.im2col2d(x if x.flags.c_contiguous else np.ascontiguousarray(x), cols, idims)
            y = np.empty(yshape, np.float32)
            ext.sgemm_packed(packed, cols, y, b, gdims, lo, hi, act, alpha)
            return y

        if _implicit(ext, g, strides, out, cgk):
            cdims = np.array([n, c, h, w, m, *kshape, *out, *begins, *strides, *dilations], np.int64)

            def implicit(packed, x, b):
                x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
                y = np.empty(yshape, np.float32)
                if ext.conv_implicit(x, packed, b, y, cdims, lo, hi, act, alpha):
                    return y
                return im2col(packed, x, b)  # below AVX-512

            return ext, implicit
        return ext, im2col

    def _residual_plan(self, packed: np.ndarray, x: np.ndarray, b: np.ndarray | None, lo: float, hi: float):
        """:meth:`_plan`'s residual form: ``conv_implicit`` adds r in its store and the merged product in its
        transposing copy; any other plan runs unclipped, then r is added and the sum clipped in numpy (the
        same operations in the same order as the unfused Conv, Add and Relu, so the same bits)."""
        plain = self._plan(packed, x, b, -np.inf, np.inf, 0)
        if plain is None:
            return None
        ext, fn = plain
        n, c, h, w = x.shape
        a = self.attrs
        begins, _, out = sp.geometry("Conv", x.shape[2:], self.kshape, auto_pad=a.get("auto_pad", "NOTSET"),
                                     pads=a.get("pads"), strides=a.get("strides"), dilations=a.get("dilations"))
        m = self.group * self.panel_rows if self.panel_rows is not None else c * int(packed.shape[1])
        yshape = (n, m, *out)
        if fn.__name__ == "implicit":
            strides = sp.ints(a.get("strides"), 2, 1, "strides", "Conv")
            dilations = sp.ints(a.get("dilations"), 2, 1, "dilations", "Conv")
            cdims = np.array([n, c, h, w, m, *self.kshape, *out, *begins, *strides, *dilations], np.int64)

            def implicit_residual(packed, x, b, r):
                x = x if x.flags.c_contiguous else np.ascontiguousarray(x)
                y = np.empty(yshape, np.float32)
                if ext.conv_implicit(x, packed, b, y, cdims, lo, hi, 0, 0.0, r):
                    return y
                return _clip(np.add(fn(packed, x, b), r, out=y), lo, hi)  # below AVX-512

            return ext, implicit_residual, yshape
        if fn.__name__ == "merged":
            def merged_residual(packed, x, b, r):
                return _clip(fn(packed, x, b, r), lo, hi)

            return ext, merged_residual, yshape

        def residual(packed, x, b, r):
            y = fn(packed, x, b)
            return _clip(np.add(y, r, out=y), lo, hi)

        return ext, residual, yshape


class EpilogueConv:
    """A FusedConv node's call: :class:`PackedConv` with the epilogue (and the BatchNormalization fold's
    packed pair) settled when the node is bound, so a call is one dict lookup by input shape and the
    plan's extension call. The plan stays valid while the bias it was made with (the same object: a
    constant in every run) and the input dtype are the ones seen, and the extension is the one it was
    made with; anything else re-plans (another bias, the numpy fallback) or takes :func:`conv_packed`.
    Thread-safe as :class:`PackedConv`."""

    __slots__ = ("_plans", "act", "alpha", "conv", "folded", "hi", "lo")

    def __init__(self, conv: PackedConv, lo: float, hi: float, act: int, alpha: float, folded: bool):
        self.conv, self.lo, self.hi, self.act, self.alpha, self.folded = conv, lo, hi, act, alpha, folded
        self._plans: dict = {}

    def __call__(self, packed, x: np.ndarray, b: np.ndarray | None = None, *_unused) -> tuple:
        if self.folded:
            packed, b = packed.w, packed.b
        plan = self._plans.get(x.shape)
        if plan is not None and plan[2] is b and plan[3] is x.dtype and plan[0] is native._ext:
            return (plan[1](packed, x, b),)
        return self._replan(packed, x, b)

    def native_plans(self) -> int:
        return sum(1 for p in self._plans.values() if p[1] != self._general)

    def _replan(self, packed, x: np.ndarray, b: np.ndarray | None) -> tuple:
        got = self.conv._plan(packed, x, b, self.lo, self.hi, self.act, self.alpha) if x.dtype == np.float32 else None
        ext, fn = got if got else (native._ext, self._general)
        self._plans[x.shape] = (ext, fn, b, x.dtype)
        return (fn(packed, x, b),)

    def _general(self, packed, x: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        c = self.conv
        return conv_packed(packed, x, b, kshape=c.kshape, group=c.group, panel_rows=c.panel_rows, lo=self.lo,
                           hi=self.hi, act=self.act, alpha=self.alpha, **c.attrs)[0]


class ResidualConv(EpilogueConv):
    """A FusedConv node reading a residual R (its last input, resolve/fusions.py's fuse_conv_add):
    ``clip(Conv(x) + R)``. R of the output's shape (float32, C-contiguous) goes into the plan's epilogue;
    any other R (broadcast, another dtype) is added by numpy after the Conv, as the Add node did."""

    __slots__ = ()

    def __call__(self, packed, x: np.ndarray, *rest) -> tuple:
        r = rest[-1]
        b = rest[0] if len(rest) > 1 else None
        if self.folded:
            packed, b = packed.w, packed.b
        plan = self._plans.get(x.shape)
        if (plan is not None and plan[2] is b and plan[3] is x.dtype and plan[0] is native._ext
                and r.shape == plan[4] and r.dtype == np.float32 and r.flags.c_contiguous):
            return (plan[1](packed, x, b, r),)
        return self._replan_residual(packed, x, b, r)

    def _replan_residual(self, packed, x: np.ndarray, b: np.ndarray | None, r: np.ndarray) -> tuple:
        got = self.conv._plan(packed, x, b, self.lo, self.hi, 0, 0.0, True) if x.dtype == np.float32 else None
        if got:
            ext, fn, yshape = got
        else:
            yshape, ext, fn = None, native._ext, None
        self._plans[x.shape] = (ext, fn, b, x.dtype, yshape)
        if fn is not None and r.shape == yshape and r.dtype == np.float32 and r.flags.c_contiguous:
            return (fn(packed, x, b, r),)
        c = self.conv
        y = conv_packed(packed, x, b, kshape=c.kshape, group=c.group, panel_rows=c.panel_rows, **c.attrs)[0]
        y = y + r if y.shape != np.broadcast_shapes(y.shape, r.shape) or y.dtype != r.dtype else np.add(y, r, out=y)
        return (_clip(y, self.lo, self.hi) if y.dtype.kind == "f" else y,)

    def native_plans(self) -> int:
        return sum(1 for p in self._plans.values() if p[1] is not None)


def _clip(y: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``y`` clipped to [lo, hi] in place (np.maximum / np.minimum: the epilogue's max and min, NaN kept)."""
    if lo != -np.inf:
        np.maximum(y, y.dtype.type(lo), out=y)
    if hi != np.inf:
        np.minimum(y, y.dtype.type(hi), out=y)
    return y


def _implicit(ext, g: int, strides, out, cgk: int) -> bool:
    """Whether a Conv runs as ``conv_implicit`` (see :data:`_IMPLICIT_MIN_WIDTH`)."""
    return (g == 1 and strides[1] <= 2 and out[1] >= _IMPLICIT_MIN_WIDTH and cgk > _NCOLS_MAXK
            and hasattr(ext, "conv_implicit"))


#: output rows at least this wide run as ``conv_implicit`` at AVX-512 (one group, column strides 1-2, K past
#: the column-vectorised task's SG_NCOLS_MAXK): the packed SGEMM's tile reading a zero-padded copy of the
#: image, no column matrix; narrower rows keep im2col (the tile is up to 12 outputs of one row). Zen 5, one
#: thread, thread CPU, same bits, load ~7: ResNet-18's 7x7/2 stem at 64x64, batch 2, 293 -> 232 us; 64 -> 64
#: 3x3 at 16x16 245 -> 208; 128 -> 128 at 8x8 231 -> 194. From 8 to 4 on this session's Intel Xeon VM (2
#: threads, whole corpus models, 15 alternated batches in one process, same bits): bn_cnn_opset9 / 13 17 ->
#: 16 us, dynamic_minus_one 22 -> 19, resnet18 (its 4-wide 3x3/2 128 -> 256) 3.56 -> 3.53 ms (noise level)
_IMPLICIT_MIN_WIDTH = 4
#: sgemm.h's SG_NCOLS_MAXK: up to this K the column-vectorised SGEMM task (no transposing store) stays
_NCOLS_MAXK = 32

#: a batch of small planes runs merged (:func:`_merged`: one pass over the weights for every image) from
#: this many weights (floats, 2 MB) on; below, the per-image columns and the SGEMM's batch cost less than
#: the merged product's transpose copy (Zen 5, one thread, thread CPU, batch 2: 8 -> 16 3x3 s2 at 8x8 6.7
#: -> 4.9 us, 64 -> 64 1x1 at 4x4 6.2 -> 2.7, 256 -> 512 1x1 s2 25.8 -> 20.4; 128 -> 128 at 8x8 and
#: 256 -> 256 at 4x4 even; 512 -> 512 at 2x2 stays merged, 280 against 332)
_MERGE_MIN_WEIGHTS = 1 << 19


def _direct(ext, kshape, strides, dilations, begins, ends, out, rows: int = 0) -> bool:
    """Whether ``conv_direct`` (im2col_direct.c) takes a Conv: unit strides and dilations, a kernel larger
    than 1x1 with leading pads inside it, and output rows that fill at least 3/4 of its 8-column
    vectors (narrower planes, late ResNet layers' 2x2 and 4x4, stay with the merged SGEMM). It computes
    what im2col + SGEMM does in the same order, without the column matrix (AVX2, one thread, load ~4:
    16 channels at 32x32 -> 8, 3x3: 210 -> 72 us; 64 -> 64 at 16x16: 690 -> 510 us). At AVX-512 its
    4-row ymm tiles lose to the 16-row zmm SGEMM once a group has more than one panel of ``rows`` (Zen 5,
    one thread, thread CPU, the same bits: ResNet-18's 64 -> 64 at 16x16, batch 2: 391 -> 281 us, 128 ->
    128 at 8x8 merged 413 -> 251, 64 -> 64 at 8x8 57 -> 51; 16 rows stay direct, 55 against 73)."""
    if not hasattr(ext, "conv_direct") or len(kshape) != 2 or kshape == (1, 1):
        return False
    if list(strides) != [1, 1] or list(dilations) != [1, 1] or min(ends) < 0:
        return False
    if any(b >= k for b, k in zip(begins, kshape)):
        return False
    if rows > native.SG_PANEL and ext.isa() == "avx512vnni":
        return False
    return -(-out[1] // 8) * 8 * 3 <= out[1] * 4


def _merged(ext, yshape, kshape, strides, begins, ends, dilations, g, mg, cgk, c, h, w, lo, hi, act, alpha):
    """A batch of small planes as conv_core merges it: the images' columns side by side (one pass over the
    weights, ``[1, g, K, N*P]``), then the ``[M, N, P]`` product copied into a C-contiguous ``[N, M, *out]``
    (later nodes on a strided view cost more than the copy: on [2, 16, 4, 4] GlobalAveragePool took
    np.mean's path, 40 vs 3 us)."""
    n, m, oh, ow = yshape
    p = oh * ow
    gdims = np.array([g, mg, cgk, n * p, 1], np.int64)
    if kshape == (1, 1) and tuple(strides) == (1, 1) and not any(begins) and not any(ends):
        def cols_of(x):  # [N, C, P] -> [C, N, P]: the pointwise columns, images side by side
            cols = np.empty((c, n, p), np.float32)
            np.copyto(cols, x.reshape(n, c, p).transpose(1, 0, 2))
            return cols
    else:
        cshape = (1, g, cgk, n * p)
        idims = np.array([n, c, h, w, g, *kshape, oh, ow, *begins, *strides, *dilations, 1], np.int64)

        def cols_of(x):
            cols = np.empty(cshape, np.float32)
            ext.im2col2d(x if x.flags.c_contiguous else np.ascontiguousarray(x), cols, idims)
            return cols

    def merged(packed, x, b, r=None):  # r: a residual of y's shape added in the copy (unclipped plans)
        ym = np.empty((m, n, p), np.float32)
        ext.sgemm_packed(packed, cols_of(x), ym, b, gdims, lo, hi, act, alpha)
        y = np.empty(yshape, np.float32)
        if r is None:
            np.copyto(y.reshape(n, m, p), ym.transpose(1, 0, 2))
        else:
            np.add(ym.transpose(1, 0, 2), r.reshape(n, m, p), out=y.reshape(n, m, p))
        return y

    return merged


def pack_panels(w: np.ndarray, *, group: int) -> np.ndarray:
    """``W [M, C/g, *k]`` in the prepacked SGEMM's panel layout ``[g, ceil(M/g/16), C/g*prod(k), 16]``."""
    return native.pack_panels(weight_matrix(w, group))


def _unpack(shape: tuple[int, ...], dtype: str):
    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(np.dtype(dtype)).reshape(shape)

    return from_bytes


@prepack_rule("Conv")
def conv_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if 1 not in const_inputs or 0 in const_inputs or not set(attrs) <= _ATTRS:
        return None
    shape, dtype = const_shapes[1]
    shape = tuple(int(d) for d in shape)
    group = int(attrs.get("group", 1))
    if dtype not in _DTYPES or len(shape) < 3 or group < 1 or shape[0] % group:
        return None
    kshape = shape[2:]
    if attrs.get("kernel_shape") and tuple(attrs["kernel_shape"]) != kshape:
        return None  # the unpacked kernel reports the mismatch
    work = "float32" if dtype in sp.HALF else dtype  # sp.work_dtype by name (np.dtype(...).name: ~29 us)
    mshape = (group, shape[0] // group, shape[1] * sp.prod(kshape))
    ks = "x".join(map(str, kshape))
    kw = {k: attrs[k] for k in ("auto_pad", "dilations", "pads", "strides") if k in attrs}
    if work == "float32" and shape[1] > 1:  # the prepacked SGEMM (one-channel groups run depthwise)
        pshape = (group, -(-mshape[1] // native.SG_PANEL), mshape[2], native.SG_PANEL)
        layout = f"conv-w-p16-{dtype}-as-float32-g{mshape[0]}-m{mshape[1]}-ck{mshape[2]}-k{ks}"
        return PrepackSpec(
            (1,), layout, functools.partial(pack_panels, group=group),
            PackedConv(kshape=kshape, group=group, panel_rows=mshape[1], **kw),
            array_to_bytes, _unpack(pshape, "float32"), packed_bytes=sp.prod(pshape) * 4,
        )
    layout = f"conv-w-gmk-{dtype}-as-{work}-g{mshape[0]}-m{mshape[1]}-ck{mshape[2]}-k{ks}"
    nbytes = sp.prod(mshape) * np.dtype(work).itemsize
    return PrepackSpec(
        (1,), layout, functools.partial(weight_matrix, group=group),
        PackedConv(kshape=kshape, group=group, **kw),
        array_to_bytes, _unpack(mshape, work), packed_bytes=nbytes if work != dtype else None,
    )
