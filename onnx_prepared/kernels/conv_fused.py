"""Conv followed by its BatchNormalization and/or activation, as one internal node
``onnx_prepared::FusedConv``.

:mod:`onnx_prepared.resolve.fusions` rewrites a Conv whose only consumer is an inference-mode
BatchNormalization into ``FusedConv(X, W, B or '', scale, bn_B, mean, var)`` with ``bn_epsilon``, a Conv
(or such a FusedConv) whose only consumer is a Relu, a Clip with constant bounds, a LeakyRelu or a
HardSwish into a FusedConv with ``activation_*``, and one whose only consumer is a residual ``Add(conv,
R)`` (with that Add's Relu or Clip) into a FusedConv reading R at input 7, whose epilogue adds R before
the clip (:class:`~onnx_prepared.kernels.conv_prepacked.ResidualConv`). The BatchNormalization is folded
into the weight and bias once, at
prepack time (``W * a``, ``(B - mean) * a + bn_B`` with ``a = scale / sqrt(var + eps)``, in float64 then
rounded: onnxruntime's ConvBNFusion does the same fold); the activation runs in the native kernels'
epilogue (``sgemm.c``, ``depthwise.c``, ``im2col_direct.c``: clip to ``[lo, hi]``, then HardSwish when ``act``
is 1, LeakyRelu of slope ``activation_alpha`` when it is 2) instead of
as a second pass over the output. Without a fold the prepack is Conv's own
(:func:`onnx_prepared.kernels.conv_prepacked.conv_rule`, same layout key: the companion cache is shared
with the unfused graph); with one the layout key adds the fold and its epsilon.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.kernels import native
from onnx_prepared.kernels.conv import conv
from onnx_prepared.kernels.conv_prepacked import conv_rule
from onnx_prepared.kernels.prepack import PrepackSpec, prepack_rule
from onnx_prepared.kernels.registry import kernel
from onnx_prepared.records import record

FUSED_DOMAIN = "onnx_prepared"
FUSED_OP = "FusedConv"
#: the fused node's own attributes (the rest are Conv's)
EPILOGUE_ATTRS = ("activation_lo", "activation_hi", "activation_act", "activation_alpha")
BN_ATTR = "bn_epsilon"
#: the residual's input position (resolve/fusions.py's fuse_conv_add: after X, W, B and the fold's four)
RESIDUAL_INPUT = 7


def fold_batchnorm(w: np.ndarray, b: np.ndarray | None, scale: np.ndarray, bn_b: np.ndarray, mean: np.ndarray,
                   var: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``BatchNormalization(Conv(x, w, b))`` as ``Conv(x, w', b')``: (w', b') in w's dtype."""
    a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + np.float64(np.float32(epsilon)))
    b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
    wf = w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))
    bf = (b0 - mean.astype(np.float64)) * a + bn_b.astype(np.float64)
    return wf.astype(w.dtype), bf.astype(w.dtype)


@kernel(FUSED_OP, since=1, domain=FUSED_DOMAIN)
def fused_conv(
    X: np.ndarray, W: np.ndarray, B: np.ndarray | None = None, scale: np.ndarray | None = None,
    bn_B: np.ndarray | None = None, mean: np.ndarray | None = None, var: np.ndarray | None = None,
    R: np.ndarray | None = None, *,
    bn_epsilon: float = 1e-5, activation_lo: float = -np.inf, activation_hi: float = np.inf,
    activation_act: int = 0, activation_alpha: float = 0.0, auto_pad: str = "NOTSET",
    dilations: list[int] | None = None, group: int = 1,
    kernel_shape: list[int] | None = None, pads: list[int] | None = None, strides: list[int] | None = None,
) -> tuple[np.ndarray]:
    """Unprepacked path (the weight is not constant): the fold per call, Conv, the residual R added, then the
    epilogue in numpy."""
    if scale is not None:
        W, B = fold_batchnorm(W, B, scale, bn_B, mean, var, bn_epsilon)
    (y,) = conv(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                strides=strides)
    if R is not None:
        y = y + R
    if y.dtype.kind == "f":
        y = native.epilogue(y if y.flags.writeable else y.copy(), activation_lo, activation_hi, activation_act,
                            activation_alpha)
    return (y,)


@record(frozen=True, slots=True)
class FoldedConv:
    """A prepacked Conv weight (Conv's own layout) with the folded bias."""

    w: np.ndarray
    b: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.w.nbytes + self.b.nbytes


def _fold_spec(base: PrepackSpec, node, attrs: dict, const_inputs: frozenset[int],
               const_shapes: dict[int, tuple]) -> PrepackSpec | None:
    """Conv's spec ``base`` with the BatchNormalization of inputs 3..6 folded in at packing."""
    has_b = bool(node.input[2])
    sources = (1, 2, 3, 4, 5, 6) if has_b else (1, 3, 4, 5, 6)
    if not set(sources) <= const_inputs:
        return None
    m = int(const_shapes[1][0][0])
    if any(tuple(const_shapes[i][0]) != (m,) or const_shapes[i][1] != "float32" for i in sources[1:]):
        return None
    eps = float(np.float32(attrs.get(BN_ATTR, 1e-5)))

    def pack(w, *rest):
        b, stats = (rest[0], rest[1:]) if has_b else (None, rest)
        wf, bf = fold_batchnorm(w, b, *stats, eps)
        return FoldedConv(base.pack(wf), bf.astype(np.float32))

    wbytes = base.packed_bytes if base.packed_bytes is not None else int(np.prod(const_shapes[1][0])) * 4

    def to_bytes(p: FoldedConv) -> np.ndarray:
        return np.concatenate([base.to_bytes(p.w), p.b.view(np.uint8)])

    def from_bytes(buf: np.ndarray) -> FoldedConv:
        return FoldedConv(base.from_bytes(buf[:wbytes]), buf[wbytes:wbytes + 4 * m].view(np.float32))

    return PrepackSpec(sources, f"{base.layout}-bnfold-eps{eps!r}-b{int(has_b)}", pack,
                       base.kernel.with_epilogue(folded=True), to_bytes, from_bytes, wbytes + 4 * m)


@prepack_rule(FUSED_OP, domain=FUSED_DOMAIN)
def fused_conv_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    ep = {k: attrs[k] for k in EPILOGUE_ATTRS if k in attrs}
    conv_attrs = {k: v for k, v in attrs.items() if k not in EPILOGUE_ATTRS and k != BN_ATTR}
    ins = tuple(node.input)
    folded = any(ins[3:RESIDUAL_INPUT])  # a folded BatchNormalization: its inputs are no Conv inputs
    residual = len(ins) > RESIDUAL_INPUT and bool(ins[RESIDUAL_INPUT])
    consts = const_inputs - {RESIDUAL_INPUT}  # the residual is an input of the call, never packed
    base = conv_rule(node, conv_attrs, consts - {2, 3, 4, 5, 6} if folded else consts, const_shapes)
    spec = _fold_spec(base, node, attrs, consts, const_shapes) if folded and base is not None else base
    if spec is None:
        return None
    kernel_fn = base.kernel.with_epilogue(
        float(ep.get("activation_lo", -np.inf)), float(ep.get("activation_hi", np.inf)),
        int(ep.get("activation_act", 0)), float(ep.get("activation_alpha", 0.0)), folded=folded, residual=residual)
    return PrepackSpec(spec.source_inputs, spec.layout, spec.pack, kernel_fn, spec.to_bytes, spec.from_bytes,
                       spec.packed_bytes)
