"""Prepacked Conv with a constant weight: W stored once as the GEMM matrix ``[g, M/g, C/g*prod(k)]``.

The matrix is contiguous and in the compute dtype (float16 weights are widened to float32 once, at
packing, instead of on every run). The layout key names everything that changes those bytes: group,
the matrix dimensions, the kernel shape, the source and packed dtypes.
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels.conv import conv_core, weight_matrix
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule

#: Conv attributes the packed kernel understands (any other attribute: no prepack, the binder decides).
_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
_DTYPES = frozenset({"float16", "float32", "float64"})


def conv_packed(packed: np.ndarray, x: np.ndarray, b: np.ndarray | None = None, *, kshape: tuple[int, ...],
                auto_pad: str = "NOTSET", dilations=None, group: int = 1, pads=None, strides=None) -> tuple:
    return (conv_core(x, packed, b, kshape, auto_pad=auto_pad, dilations=dilations, group=group, pads=pads,
                      strides=strides),)


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
    layout = (f"conv-w-gmk-{dtype}-as-{work}-g{mshape[0]}-m{mshape[1]}-ck{mshape[2]}"
              f"-k{'x'.join(map(str, kshape))}")
    kw = {k: attrs[k] for k in ("auto_pad", "dilations", "pads", "strides") if k in attrs}
    nbytes = sp.prod(mshape) * np.dtype(work).itemsize
    return PrepackSpec(
        (1,), layout, functools.partial(weight_matrix, group=group),
        functools.partial(conv_packed, kshape=kshape, group=group, **kw),
        array_to_bytes, _unpack(mshape, work), packed_bytes=nbytes if work != dtype else None,
    )
