"""ConvTranspose: one GEMM per group to columns ``W^T @ X``, then col2im as one strided add per kernel tap.

Output size, pads and auto_pad follow onnxruntime: with ``output_shape`` (or SAME_* auto_pad) the total
padding is ``stride*(in-1) + output_padding + dilation*(k-1) + 1 - out`` (at least 0), its smaller half
at the head for SAME_UPPER, its larger half at the head for SAME_LOWER and an explicit
output_shape. Half-precision computes in float32. When every stride equals its kernel extent (no
dilation, pads or output padding) the taps tile the output and col2im is a single transpose. A
constant float32 weight is prepacked (``convT-w-p16``): the GEMM runs on ``native.sgemm_packed``.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import native
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.registry import kernel

_F32 = np.dtype(np.float32)


def _geometry(in_shape, kshape, *, auto_pad, pads, strides, dilations, output_padding, output_shape):
    nd = len(in_shape)
    op = "ConvTranspose"
    strides = sp.ints(strides, nd, 1, "strides", op)
    dilations = sp.ints(dilations, nd, 1, "dilations", op)
    out_pad = sp.ints(output_padding, nd, 0, "output_padding", op)
    if output_shape is not None and len(output_shape) == nd + 2:
        output_shape = output_shape[2:]
    shape = sp.ints(output_shape, nd, -1, "output_shape", op) if output_shape else None
    begins, ends, out = [], [], []
    for i in range(nd):
        full = strides[i] * (in_shape[i] - 1) + out_pad[i] + dilations[i] * (kshape[i] - 1) + 1
        if shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = shape[i] if shape is not None else in_shape[i] * strides[i]
            total = max(0, full - o)
            o = full - total if shape is None else o
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        elif auto_pad == "VALID":
            b = e = 0
            o = full
        elif auto_pad in ("NOTSET", ""):
            p = sp.ints(pads, 2 * nd, 0, "pads", op)
            b, e = p[i], p[i + nd]
            o = full - b - e
        else:
            raise KernelError(f"{op}: unknown auto_pad {auto_pad!r}")
        if o < 1:
            raise KernelError(f"{op}: output size {o} on spatial axis {i} (input shape {list(in_shape)})")
        begins.append(b)
        ends.append(e)
        out.append(o)
    return tuple(begins), tuple(out), strides, dilations


@kernel("ConvTranspose", since=1)
def conv_transpose(
    X: np.ndarray, W: np.ndarray, B: np.ndarray | None = None, *, auto_pad: str = "NOTSET",
    dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None, output_shape: list[int] | None = None,
    pads: list[int] | None = None, strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    kshape = tuple(W.shape[2:])
    if W.ndim != X.ndim:
        raise KernelError(f"ConvTranspose: input {list(X.shape)} and weight {list(W.shape)} ranks differ")
    c = X.shape[1] if X.ndim > 1 else 0
    if group < 1 or c % group or W.shape[0] != c:
        raise KernelError(f"ConvTranspose: input channels {c} do not match weight {list(W.shape)}, group={group}")
    wd = sp.work_dtype(X.dtype)
    cg, mg, k = c // group, W.shape[1], sp.prod(kshape)
    wt = W.astype(wd, copy=False).reshape(group, cg, mg * k).transpose(0, 2, 1)  # [g, mg*K, cg]
    return (conv_transpose_core(X, lambda xg: np.matmul(wt, xg), mg, kshape, B, auto_pad=auto_pad,
                                dilations=dilations, group=group, kernel_shape=kernel_shape,
                                output_padding=output_padding, output_shape=output_shape, pads=pads,
                                strides=strides),)


def conv_transpose_core(X: np.ndarray, gemm, mg: int, kshape: tuple[int, ...], B: np.ndarray | None, *, auto_pad,
                        dilations, group: int, kernel_shape, output_padding, output_shape, pads, strides,
                        plans: dict | None = None) -> np.ndarray:
    """ConvTranspose of ``X`` given ``gemm(X_g [n, g, C/g, P_in]) -> cols [n, g, M/g*K, P_in]`` (the
    weight's part: numpy's matmul of ``W^T``, or the prepacked SGEMM); ``plans`` caches the geometry
    per input shape."""
    nd = X.ndim - 2
    if nd < 1:
        raise KernelError(f"ConvTranspose: input {list(X.shape)} has no spatial axis")
    if kernel_shape and tuple(kernel_shape) != kshape:
        raise KernelError(f"ConvTranspose: kernel_shape={list(kernel_shape)} differs from the weight's {list(kshape)}")
    n, c = X.shape[:2]
    m = mg * group
    if B is not None and B.shape != (m,):
        raise KernelError(f"ConvTranspose: bias shape {list(B.shape)} is not [{m}]")
    geom = plans.get(X.shape) if plans is not None else None
    if geom is None:
        geom = _geometry(X.shape[2:], kshape, auto_pad=auto_pad, pads=pads, strides=strides, dilations=dilations,
                         output_padding=output_padding, output_shape=output_shape)
        tiled = all(geom[2][i] == kshape[i] and geom[3][i] == 1 and not geom[0][i]
                    and geom[1][i] == kshape[i] * X.shape[2 + i] for i in range(nd))
        geom = geom + (tiled,)
        if plans is not None:
            plans[X.shape] = geom
    begins, out, strides, dilations, tiled = geom
    wd = sp.work_dtype(X.dtype)
    k = sp.prod(kshape)
    p_in = sp.prod(X.shape[2:])
    cols = gemm(X.astype(wd, copy=False).reshape(n, group, c // group, p_in))  # [n, g, mg*K, P_in]
    cols = cols.reshape((n, m, k) + X.shape[2:])
    if tiled:
        y = _tile(cols, n, m, kshape, X.shape[2:], out)
        if B is not None:
            y += B.astype(wd, copy=False).reshape((m,) + (1,) * nd)
        return y.astype(X.dtype, copy=False)
    # col2im into a buffer covering every scattered position and the cropped window
    span = [strides[i] * (X.shape[2 + i] - 1) + dilations[i] * (kshape[i] - 1) + 1 for i in range(nd)]
    size = [max(span[i], begins[i] + out[i]) for i in range(nd)]
    full = np.zeros((n, m) + tuple(size), dtype=wd)
    for t, tap in enumerate(itertools.product(*(range(kk) for kk in kshape))):
        idx = (slice(None), slice(None)) + tuple(
            slice(tap[i] * dilations[i], tap[i] * dilations[i] + strides[i] * (X.shape[2 + i] - 1) + 1, strides[i])
            for i in range(nd))
        full[idx] += cols[:, :, t]
    y = full[(slice(None), slice(None)) + tuple(slice(begins[i], begins[i] + out[i]) for i in range(nd))]
    y = np.ascontiguousarray(y)
    if B is not None:
        y += B.astype(wd, copy=False).reshape((m,) + (1,) * nd)
    return y.astype(X.dtype, copy=False)


def _tile(cols: np.ndarray, n: int, m: int, kshape, in_shape, out) -> np.ndarray:
    """col2im when stride = kernel (a UNet's 2x2 upsampling): the taps tile the output without overlap,
    so it is one transpose, ``y[.., i*k + a, ..] = cols[.., tap a, .., i, ..]``."""
    nd = len(kshape)
    if nd == 2 and kshape[1] == 2 and cols.dtype.itemsize == 4:
        # NOTE: numpy copies an inner axis of 2 element by element; the (j, b) interleave of a row is
        # one uint64 per pair instead (b = 0 in the low half, little-endian), then rows move whole
        kh, (h, w) = kshape[0], in_shape
        pairs = cols.reshape(n, m, kh, 2, h, w).view(np.uint32)
        wide = pairs[:, :, :, 0].astype(np.uint64)
        wide |= pairs[:, :, :, 1].astype(np.uint64) << np.uint64(32)
        rows = wide.view(cols.dtype)  # [n, m, a, i, (j, b)]
        return np.ascontiguousarray(rows.transpose(0, 1, 3, 2, 4)).reshape((n, m) + tuple(out))
    return cols.reshape((n, m) + tuple(kshape) + tuple(in_shape)).transpose(
        (0, 1) + tuple(a for i in range(nd) for a in (2 + nd + i, 2 + i))).reshape((n, m) + tuple(out))


# **** prepacked: W^T in the prepacked SGEMM's panels ****

_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads",
                    "strides"})


def pack_transposed(w: np.ndarray, *, group: int) -> np.ndarray:
    """``W [C, M/g, *k]`` float32 as ``W_g^T [g, M/g*K, C/g]`` in ``native.pack_panels``' layout."""
    c, mg = w.shape[:2]
    wt = w.reshape(group, c // group, mg * sp.prod(w.shape[2:])).transpose(0, 2, 1)
    return native.pack_panels(np.ascontiguousarray(wt, dtype=np.float32))


class PackedConvTranspose:
    """ConvTranspose on a prepacked weight: the GEMM to columns is ``native.sgemm_packed`` (every core,
    the weights streamed once; numpy's matmul of the unpacked matrix without the extension) instead of
    numpy's matmul of a transposed view on each run."""

    __slots__ = ("_last", "attrs", "kshape", "mg", "plans", "rows")

    def __init__(self, *, kshape: tuple[int, ...], mg: int, **attrs):
        self.kshape, self.mg, self.attrs = kshape, mg, attrs
        self.rows = mg * sp.prod(kshape)
        self.plans: dict = {}  # input shape -> geometry (a race only computes one twice)
        # the last tiled call's shape, extension, columns' shape, SGEMM dims, output shape, col2im dims, bias
        # shape: checked inline, the next call of that shape is the two extension calls (~6 us less Python)
        self._last: tuple = (None,) * 7

    def __call__(self, packed: np.ndarray, X: np.ndarray, B: np.ndarray | None = None) -> tuple[np.ndarray]:
        last = self._last
        if (X.shape == last[0] and X.dtype is _F32 and last[1] is native._ext and X.flags.c_contiguous
                and (B is None or (B.dtype is _F32 and B.shape == last[6]))):
            ext = last[1]
            cols = np.empty(last[2], _F32)
            ext.sgemm_packed(packed, X, cols, None, last[3], -np.inf, np.inf, 0)
            y = np.empty(last[4], _F32)
            ext.col2im_tiled(cols, B, y, last[5])
            return (y,)
        rows = self.rows
        geom = self.plans.get(X.shape)
        ext = native._ext
        if (geom is not None and geom[4] and ext is not None and X.ndim == 4 and X.dtype == np.float32
                and (B is None or (B.dtype == np.float32 and B.shape == (self.mg * self.attrs["group"],)))):
            return (self._tiled(ext, packed, X, B, geom[1]),)

        def gemm(xg: np.ndarray) -> np.ndarray:
            return native.sgemm_packed(packed, rows, xg if xg.dtype == np.float32 else xg.astype(np.float32))

        return (conv_transpose_core(X, gemm, self.mg, self.kshape, B, plans=self.plans, **self.attrs),)


    def _tiled(self, ext, packed: np.ndarray, X: np.ndarray, B: np.ndarray | None, out) -> np.ndarray:
        """Stride = kernel (the geometry the first call planned): the packed SGEMM to columns, then the
        tiling col2im and the bias in one extension pass (im2col.c col2im_tiled: UNet's 16 x 8x8 2x2/2
        86 -> ~20 us; the numpy interleave and transpose were most of it). The same values."""
        n, c, h, w = X.shape
        g = self.attrs["group"]
        kh, kw = self.kshape
        cols_shape, y_shape = (n, g, self.rows, h * w), (n, self.mg * g, *out)
        d_gemm = np.array([g, self.rows, c // g, h * w, n], np.int64)
        d_col = np.array([n, self.mg * g, kh, kw, h, w], np.int64)
        cols = np.empty(cols_shape, np.float32)
        ext.sgemm_packed(packed, X if X.flags.c_contiguous else np.ascontiguousarray(X), cols, None, d_gemm,
                         -np.inf, np.inf, 0)
        y = np.empty(y_shape, np.float32)
        ext.col2im_tiled(cols, B, y, d_col)
        self._last = (X.shape, ext, cols_shape, d_gemm, tuple(int(d) for d in y_shape), d_col, (self.mg * g,))
        return y


def _unpack(shape: tuple[int, ...]):
    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(np.float32).reshape(shape)

    return from_bytes


@prepack_rule("ConvTranspose")
def conv_transpose_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    """A constant float32 weight: ``W^T`` packed once (layout ``convT-w-p16``: group, the GEMM's rows
    and depth, the kernel shape)."""
    if 1 not in const_inputs or 0 in const_inputs or not set(attrs) <= _ATTRS:
        return None
    shape, dtype = const_shapes[1]
    shape = tuple(int(d) for d in shape)
    group = int(attrs.get("group", 1))
    if dtype != "float32" or len(shape) < 3 or group < 1 or shape[0] % group:
        return None
    kshape = shape[2:]
    if attrs.get("kernel_shape") and tuple(attrs["kernel_shape"]) != kshape:
        return None  # the unpacked kernel reports the mismatch
    rows, depth = shape[1] * sp.prod(kshape), shape[0] // group
    pshape = (group, -(-rows // native.SG_PANEL), depth, native.SG_PANEL)
    ks = "x".join(map(str, kshape))
    kw = {k: attrs.get(k) for k in ("auto_pad", "dilations", "kernel_shape", "output_padding", "output_shape",
                                    "pads", "strides")}
    kw["auto_pad"] = kw["auto_pad"] or "NOTSET"
    return PrepackSpec(
        (1,), f"convT-w-p16-float32-g{group}-mk{rows}-c{depth}-k{ks}", functools.partial(pack_transposed, group=group),
        PackedConvTranspose(kshape=kshape, mg=shape[1], group=group, **kw),
        array_to_bytes, _unpack(pshape), packed_bytes=sp.prod(pshape) * 4,
    )
