"""A squeeze-and-excitation block as one internal node ``onnx_prepared::SqueezeExcite``.

``Mul(X, gate(Conv2(Relu(Conv1(GlobalAveragePool(X))))))`` with 1x1 Convs of constant weights, the gate
a HardSigmoid or a Sigmoid (MobileNetV3, EfficientNet): :func:`onnx_prepared.resolve.fusions.fuse_squeeze_excite`
rewrites it into ``SqueezeExcite(X, W1, B1, W2, B2)``. Six nodes on a ``[N, C]`` vector cost six dispatches
and six small numpy calls each; here the vector goes through two small matrix products and one
broadcast multiply.

With constant float32 weights the prepack (layout ``se-w-t-...``) stores both 1x1 weights transposed,
``W1t [C, C/r]`` then ``W2t [C/r, C]`` in one array, so that each product is a sum of scaled weight rows;
with a HardSigmoid gate the whole block is then one call of ``se_block.c``. Otherwise (Sigmoid gate, no
extension, other dtypes) it runs in numpy on the same matrices.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels.activation import sigmoid
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.registry import kernel

FUSED_DOMAIN = "onnx_prepared"
FUSED_OP = "SqueezeExcite"
#: ``gate`` codes
GATE_HARD_SIGMOID, GATE_SIGMOID = 0, 1


def _squeeze(x: np.ndarray) -> np.ndarray:
    n, c = x.shape[:2]
    if x.dtype == np.float32 and x.flags.c_contiguous and x.size:
        s = native.global_avg(x)
        if s is not None:
            return s.reshape(n, c)
    return np.mean(x.reshape(n, c, -1), axis=2, dtype=np.float32 if x.dtype == np.float32 else None)


def _excite(x: np.ndarray, w1t: np.ndarray, b1, w2t: np.ndarray, b2, gate: int, alpha: float,
            beta: float) -> np.ndarray:
    """The block with ``w1t [C, C/r]`` and ``w2t [C/r, C]``."""
    if x.ndim < 3:
        raise KernelError(f"SqueezeExcite: input must have a spatial axis, got shape {list(x.shape)}")
    n, c = x.shape[:2]
    if w1t.shape[0] != c or w2t.shape != w1t.shape[::-1]:
        raise KernelError(f"SqueezeExcite: weights {list(w1t.shape[::-1])} and {list(w2t.shape[::-1])} do not fit "
                          f"{c} channels (input shape {list(x.shape)})")
    if gate == GATE_HARD_SIGMOID and x.dtype == np.float32 and x.flags.c_contiguous and x.size and all(
            a is None or (a.dtype == np.float32 and a.flags.c_contiguous) for a in (w1t, b1, w2t, b2)):
        y = native.se_block(x, w1t, b1, w2t, b2, alpha, beta)
        if y is not None:
            return y
    h = _squeeze(x) @ w1t
    if b1 is not None:
        h += b1
    np.maximum(h, 0, out=h)
    g = h @ w2t
    if b2 is not None:
        g += b2
    if gate == GATE_SIGMOID:
        (g,) = sigmoid(g)
    else:
        g *= g.dtype.type(alpha)
        g += g.dtype.type(beta)
        np.clip(g, 0, 1, out=g)
    return x * g.astype(x.dtype, copy=False).reshape((n, c) + (1,) * (x.ndim - 2))


@kernel(FUSED_OP, since=1, domain=FUSED_DOMAIN)
def squeeze_excite(
    X: np.ndarray, W1: np.ndarray, B1: np.ndarray | None, W2: np.ndarray, B2: np.ndarray | None, *, gate: int = 0,
    alpha: float = 0.2, beta: float = 0.5,
) -> tuple[np.ndarray]:
    """Unprepacked path: the weights transposed per call."""
    cr, c = W1.shape[0], W2.shape[0]
    if W1.size != cr * c or W2.size != c * cr:
        raise KernelError(f"SqueezeExcite: weights {list(W1.shape)} and {list(W2.shape)} are not 1x1 Convs of "
                          f"{c} <-> {cr} channels")
    w1t = np.ascontiguousarray(W1.reshape(cr, c).T)
    w2t = np.ascontiguousarray(W2.reshape(c, cr).T)
    return (_excite(X, w1t, B1, w2t, B2, gate, alpha, beta),)


def _pack(w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    cr, c = w1.shape[0], w2.shape[0]
    return np.concatenate([w1.reshape(cr, c).T.ravel(), w2.reshape(c, cr).T.ravel()]).astype(np.float32)


def _packed_kernel(c: int, cr: int, gate: int, alpha: float, beta: float, packed: np.ndarray, x: np.ndarray,
                   b1: np.ndarray | None = None, b2: np.ndarray | None = None) -> tuple:
    w1t, w2t = packed[:c * cr].reshape(c, cr), packed[c * cr:].reshape(cr, c)
    return (_excite(x, w1t, b1, w2t, b2, gate, alpha, beta),)


_F32 = np.dtype(np.float32)


def _f32(a: np.ndarray | None) -> bool:
    return a is None or (a.dtype == _F32 and a.flags.c_contiguous)


class PackedSqueezeExcite:
    """The prepacked block's call (:func:`_packed_kernel`) with a plan per input shape: once a shape has run
    on ``se_block.c``, a later call with the same packed weights and biases (the same objects: constants in
    every run), a C-contiguous float32 input and the same extension allocates the output and makes the one
    extension call, with the weight views and the dims array made once (the checks and views of
    :func:`_excite` cost ~4 us a call, more than the 96-channel block itself). Anything else takes
    :func:`_packed_kernel`. Thread-safe: plans are immutable and a race only builds one twice."""

    __slots__ = ("_plans", "alpha", "beta", "c", "cr", "gate")

    def __init__(self, c: int, cr: int, gate: int, alpha: float, beta: float):
        self.c, self.cr, self.gate, self.alpha, self.beta = c, cr, gate, float(alpha), float(beta)
        self._plans: dict = {}

    def __call__(self, packed: np.ndarray, x: np.ndarray, b1: np.ndarray | None = None,
                 b2: np.ndarray | None = None) -> tuple:
        plan = self._plans.get(x.shape)
        if (plan is not None and plan[0] is packed and plan[1] is b1 and plan[2] is b2 and plan[3] is native._ext
                and x.dtype == _F32 and x.flags.c_contiguous):
            y = np.empty(x.shape, _F32)
            plan[3].se_block(x, plan[4], b1, plan[5], b2, y, plan[6], self.alpha, self.beta)
            return (y,)
        return self._replan(packed, x, b1, b2)

    def _replan(self, packed: np.ndarray, x: np.ndarray, b1: np.ndarray | None, b2: np.ndarray | None) -> tuple:
        c, cr = self.c, self.cr
        out = _packed_kernel(c, cr, self.gate, self.alpha, self.beta, packed, x, b1, b2)  # checks, reports
        ext = native._ext
        if (ext is not None and self.gate == GATE_HARD_SIGMOID and x.ndim >= 3 and x.size and x.shape[1] == c
                and packed.size == 2 * c * cr and all(map(_f32, (x, packed, b1, b2)))):
            w1t, w2t = packed[:c * cr].reshape(c, cr), packed[c * cr:].reshape(cr, c)
            dims = np.array([x.shape[0], c, x.size // (x.shape[0] * c), cr], np.int64)
            self._plans[x.shape] = (packed, b1, b2, ext, w1t, w2t, dims)
        return out


@prepack_rule(FUSED_OP, domain=FUSED_DOMAIN)
def squeeze_excite_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if not {1, 3} <= const_inputs or 0 in const_inputs or set(attrs) - {"gate", "alpha", "beta"}:
        return None
    (s1, d1), (s2, d2) = const_shapes[1], const_shapes[3]
    if d1 != "float32" or d2 != "float32" or len(s1) < 3 or len(s2) < 3:
        return None
    cr, c = int(s1[0]), int(s2[0])
    if int(np.prod(s1)) != cr * c or int(np.prod(s2)) != c * cr:
        return None
    kernel_fn = PackedSqueezeExcite(c, cr, int(attrs.get("gate", 0)), float(attrs.get("alpha", 0.2)),
                                    float(attrs.get("beta", 0.5)))
    return PrepackSpec((1, 3), f"se-w-t-float32-c{c}-r{cr}", _pack, kernel_fn, array_to_bytes,
                       lambda buf: buf.view(np.float32))
