"""com.microsoft BiasGelu and Gelu (onnxruntime's transformer optimizer fuses the exported erf GELU into them).

``onnxruntime/contrib_ops/cpu/bert/bias_gelu.cc`` computes, in float32, ``v = x + bias``,
``t = v * (1 / sqrt 2)``, MLAS's erf of ``t``, then ``(v * 0.5) * (erf + 1)``; this module does the same
with :func:`activation.erf`. onnxruntime 1.32's results differ from that in the last bit for ~40 % of
the elements (9.5e-7 at |y| ~ 9; no association of these operations reproduces them, so its erf here is
not the one its Erf op runs): within tolerance, not bit-exact.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.activation import erf
from onnx_prepared.kernels.registry import kernel

_INV_SQRT2 = np.float32(1.0) / np.float32(np.sqrt(2.0))


def _gelu(v: np.ndarray) -> np.ndarray:
    (e,) = erf(v * _INV_SQRT2)
    e += np.float32(1.0)
    return (v * np.float32(0.5)) * e


@kernel("BiasGelu", since=1, domain="com.microsoft")
def bias_gelu(x: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
    if x.dtype != np.float32 or bias.dtype != np.float32:
        raise KernelError(f"BiasGelu supports float32, got {x.dtype} and {bias.dtype}")
    if bias.ndim != 1 or not x.shape or x.shape[-1] != bias.shape[0]:
        raise KernelError(f"BiasGelu bias must be 1-D with the input's last dimension, got {bias.shape} for {x.shape}")
    return (_gelu(x + bias),)


@kernel("Gelu", since=1, domain="com.microsoft")
def gelu(x: np.ndarray) -> tuple[np.ndarray]:
    if x.dtype != np.float32:
        raise KernelError(f"com.microsoft Gelu supports float32 here, got {x.dtype}")
    return (_gelu(x),)
