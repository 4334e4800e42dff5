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
                panel_rows: int | None = None, lo: float = -np.inf, hi: float = np.inf, act: int = 0) -> tuple:
    return (conv_core(x, packed, b, kshape, auto_pad=auto_pad, dilations=dilations, group=group, pads=pads,
                      strides=strides, panel_rows=panel_rows, lo=lo, hi=hi, act=act),)


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
    work = sp.work_dtype(np.dtype(dtype)).name
    mshape = (group, shape[0] // group, shape[1] * sp.prod(kshape))
    ks = "x".join(map(str, kshape))
    kw = {k: attrs[k] for k in ("auto_pad", "dilations", "pads", "strides") if k in attrs}
    if work == "float32" and shape[1] > 1:  # the prepacked SGEMM (one-channel groups run depthwise)
        pshape = (group, -(-mshape[1] // native.SG_PANEL), mshape[2], native.SG_PANEL)
        layout = f"conv-w-p16-{dtype}-as-float32-g{mshape[0]}-m{mshape[1]}-ck{mshape[2]}-k{ks}"
        return PrepackSpec(
            (1,), layout, functools.partial(pack_panels, group=group),
            functools.partial(conv_packed, kshape=kshape, group=group, panel_rows=mshape[1], **kw),
            array_to_bytes, _unpack(pshape, "float32"), packed_bytes=sp.prod(pshape) * 4,
        )
    layout = f"conv-w-gmk-{dtype}-as-{work}-g{mshape[0]}-m{mshape[1]}-ck{mshape[2]}-k{ks}"
    nbytes = sp.prod(mshape) * np.dtype(work).itemsize
    return PrepackSpec(
        (1,), layout, functools.partial(weight_matrix, group=group),
        functools.partial(conv_packed, kshape=kshape, group=group, **kw),
        array_to_bytes, _unpack(mshape, work), packed_bytes=nbytes if work != dtype else None,
    )
