"""Conv followed by its activation, as one internal node ``onnx_prepared::FusedConv``.

:func:`onnx_prepared.resolve.fusions.fuse_conv_activation` rewrites a Conv whose only consumer is a
Relu, a Clip with constant bounds or a HardSwish into this node; the activation then runs in the
native kernels' epilogue (``sgemm.c``, ``depthwise.c``: clip to ``[lo, hi]``, then HardSwish when
``act`` is 1) instead of as a second pass over the output. The weight prepack is Conv's own
(:func:`onnx_prepared.kernels.conv_prepacked.conv_rule`, same layout key: the companion cache is shared
with the unfused graph).
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.kernels import native
from onnx_prepared.kernels.conv import conv
from onnx_prepared.kernels.conv_prepacked import conv_rule
from onnx_prepared.kernels.prepack import PrepackSpec, prepack_rule
from onnx_prepared.kernels.registry import kernel

FUSED_DOMAIN = "onnx_prepared"
FUSED_OP = "FusedConv"
#: the fused node's own attributes (the rest are Conv's)
EPILOGUE_ATTRS = ("activation_lo", "activation_hi", "activation_act")


@kernel(FUSED_OP, since=1, domain=FUSED_DOMAIN)
def fused_conv(
    X: np.ndarray, W: np.ndarray, B: np.ndarray | None = None, *, activation_lo: float = -np.inf,
    activation_hi: float = np.inf, activation_act: int = 0, auto_pad: str = "NOTSET",
    dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
    pads: list[int] | None = None, strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    """Unprepacked path (the weight is not constant): Conv, then the epilogue in numpy."""
    (y,) = conv(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                strides=strides)
    if y.dtype.kind == "f":
        y = native.epilogue(y if y.flags.writeable else y.copy(), activation_lo, activation_hi, activation_act)
    return (y,)


@prepack_rule(FUSED_OP, domain=FUSED_DOMAIN)
def fused_conv_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    ep = {k: attrs[k] for k in EPILOGUE_ATTRS if k in attrs}
    spec = conv_rule(node, {k: v for k, v in attrs.items() if k not in EPILOGUE_ATTRS}, const_inputs, const_shapes)
    if spec is None:
        return None
    kernel_fn = functools.partial(spec.kernel, lo=float(ep.get("activation_lo", -np.inf)),
                                  hi=float(ep.get("activation_hi", np.inf)), act=int(ep.get("activation_act", 0)))
    return PrepackSpec(spec.source_inputs, spec.layout, spec.pack, kernel_fn, spec.to_bytes, spec.from_bytes,
                       spec.packed_bytes)
