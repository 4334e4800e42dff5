"""com.microsoft BiasGelu and Gelu (onnxruntime's transformer optimizer fuses the exported erf GELU into them).

``onnxruntime/contrib_ops/cpu/bert/bias_gelu.cc`` computes, in float32, ``v = x + bias``,
``t = v * (1 / sqrt 2)``, MLAS's erf of ``t``, then ``(v * 0.5) * (erf + 1)``; this module does the same
with :func:`activation.erf` (float32 with the extension: the exact GELU's one native call, which divides
by sqrt 2 instead, an ulp apart now and then). onnxruntime 1.32's results differ from either in the last
bit for ~40 % of the elements (9.5e-7 at |y| ~ 9; no association of these operations reproduces them,
so its erf here is not the one its Erf op runs): within tolerance, not bit-exact.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels.activation import erf
from onnx_prepared.kernels.registry import kernel

_INV_SQRT2 = np.float32(1.0) / np.float32(np.sqrt(2.0))
_SQRT2 = 2 ** 0.5


def _gelu(v: np.ndarray) -> np.ndarray:
    if native._ext is not None and v.dtype == np.float32:
        # activation.gelu_erf's one call: t = v / sqrt 2 (not v * (1 / sqrt 2): an ulp apart now and
        # then) and (v * (erf + 1)) * 0.5, which equals (v * 0.5) * (erf + 1) (a halving is exact)
        y = np.empty(v.shape, np.float32)
        native._ext.gelu_erf_f32(np.ascontiguousarray(v), y, v.size, _SQRT2, 1.0, 0.5)
        return y
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
