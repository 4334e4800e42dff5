"""onnx_prepared::SiLU: ``Mul(x, Sigmoid(x))``, optionally times a gate ``u`` (the Llama MLP's
``silu(gate) * up``), as resolve/fusions_silu.py fuses it.

float32 with the extension: one native pass (``_native/silu.c``) reading ``x`` and ``u`` where they are
(the gate and up halves of one MatMulNBits output are strided views) and writing the result once. It
computes the unfused kernels' bits: the Sigmoid kernel's logistic at the same dispatch level, then the
two products each rounded once, as numpy's multiply rounds them. Anything else (another dtype, ``u``
broadcasting, no extension) runs the unfused kernels one after another.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.kernels import native
from onnx_prepared.kernels.activation import sigmoid
from onnx_prepared.kernels.registry import kernel

_F32 = np.dtype(np.float32)


@kernel("SiLU", since=1, domain="onnx_prepared")
def silu(x: np.ndarray, u: np.ndarray | None = None) -> tuple[np.ndarray]:
    """``x * sigmoid(x)``, times ``u`` when given."""
    ext = native._ext
    if ext is not None and x.dtype == _F32 and (u is None or (u.dtype == _F32 and u.shape == x.shape)):
        y = np.empty(x.shape, _F32)
        try:
            ext.silu(x, u, y)
            return (y,)
        except ValueError:  # a view whose leading axes are not rows of one stride: the unfused kernels
            pass
    (s,) = sigmoid(x)
    t = np.multiply(x, s)
    if u is not None:
        t = np.multiply(t, u)
    return (np.asarray(t),)
