"""ConvTranspose: one GEMM per group to columns ``W^T @ X``, then col2im as one strided add per kernel tap.

Output size, pads and auto_pad follow onnxruntime: with ``output_shape`` (or SAME_* auto_pad) the total
padding is ``stride*(in-1) + output_padding + dilation*(k-1) + 1 - out`` (at least 0), its smaller half
at the head for SAME_UPPER, its larger half at the head for SAME_LOWER and an explicit
output_shape. Half-precision computes in float32. When every stride equals its kernel extent (no
dilation, pads or output padding) the taps tile the output and col2im is a single transpose.
"""

from __future__ import annotations

import itertools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels.registry import kernel


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
    nd = X.ndim - 2
    kshape = tuple(W.shape[2:])
    if nd < 1 or W.ndim != X.ndim:
        raise KernelError(f"ConvTranspose: input {list(X.shape)} and weight {list(W.shape)} ranks differ")
    if kernel_shape and tuple(kernel_shape) != kshape:
        raise KernelError(f"ConvTranspose: kernel_shape={list(kernel_shape)} differs from the weight's {list(kshape)}")
    n, c = X.shape[:2]
    if group < 1 or c % group or W.shape[0] != c:
        raise KernelError(f"ConvTranspose: input channels {c} do not match weight {list(W.shape)}, group={group}")
    mg = W.shape[1]
    m = mg * group
    begins, out, strides, dilations = _geometry(X.shape[2:], kshape, auto_pad=auto_pad, pads=pads,
                                                strides=strides, dilations=dilations,
                                                output_padding=output_padding, output_shape=output_shape)
    wd = sp.work_dtype(X.dtype)
    k = sp.prod(kshape)
    p_in = sp.prod(X.shape[2:])
    cg = c // group
    # cols[n, g, mg*K, P_in] = W_g^T [mg*K, cg] @ X_g [cg, P_in]
    wt = W.astype(wd, copy=False).reshape(group, cg, mg * k).transpose(0, 2, 1)
    cols = np.matmul(wt, X.astype(wd, copy=False).reshape(n, group, cg, p_in))
    cols = cols.reshape((n, m, k) + X.shape[2:])
    if all(strides[i] == kshape[i] and dilations[i] == 1 and not begins[i] and out[i] == kshape[i] * X.shape[2 + i]
           for i in range(nd)):
        # stride = kernel (a UNet's 2x2 upsampling): the taps tile the output without overlap, so col2im
        # is one transpose: y[.., i*k + a, ..] = cols[.., tap a, .., i, ..]
        y = cols.reshape((n, m) + kshape + X.shape[2:]).transpose(
            (0, 1) + tuple(a for i in range(nd) for a in (2 + nd + i, 2 + i))).reshape((n, m) + tuple(out))
        if B is not None:
            if B.shape != (m,):
                raise KernelError(f"ConvTranspose: bias shape {list(B.shape)} is not [{m}]")
            y += B.astype(wd, copy=False).reshape((m,) + (1,) * nd)
        return (y.astype(X.dtype, copy=False),)
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
        if B.shape != (m,):
            raise KernelError(f"ConvTranspose: bias shape {list(B.shape)} is not [{m}]")
        y += B.astype(wd, copy=False).reshape((m,) + (1,) * nd)
    return (y.astype(X.dtype, copy=False),)
