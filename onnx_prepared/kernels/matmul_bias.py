"""``onnx_prepared::MatMulBias(A, W, bias)``: MatMul(A, W) + Add(bias) in one kernel call
(resolve/fusions.py writes it for a float32 initializer W [K, N] and bias [N]).

The product is one BLAS call on A viewed as ``[rows, K]`` (numpy's stacked matmul of a 3-D A runs one
GEMM per leading index), and the bias is added in place: the unfused graph's float32 operations, the
same values. With W constant it is prepacked as MatMul's is (the same ``[K, N]`` panel and layout key,
so a MatMul and a MatMulBias of one W share the prepared object).
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.registry import kernel


def _product(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    if a.ndim >= 2 and a.dtype == w.dtype and w.ndim == 2:
        k = w.shape[0]
        if a.shape[-1] == k:
            return (a.reshape(-1, k) @ w).reshape(a.shape[:-1] + (w.shape[1],))
    return np.asarray(np.matmul(a, w))  # anything else: MatMul's own semantics (and its errors)


@kernel("MatMulBias", since=1, domain="onnx_prepared")
def matmul_bias(a: np.ndarray, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
    y = _product(a, w)
    y += bias
    return (y,)


def matmul_bias_packed(packed: np.ndarray, a: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
    y = _product(a, packed)
    y += bias
    return (y,)


def _unpack(shape: tuple[int, ...], dtype: str):
    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(np.dtype(dtype)).reshape(shape)

    return from_bytes


@prepack_rule("MatMulBias", domain="onnx_prepared")
def matmul_bias_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if 1 not in const_inputs or 0 in const_inputs:
        return None
    shape, dtype = const_shapes[1]
    if len(shape) != 2 or dtype not in ("float32", "float64"):
        return None
    layout = f"matmul-b-kn-{dtype}-k{shape[0]}-n{shape[1]}"
    return PrepackSpec((1,), layout, np.ascontiguousarray, matmul_bias_packed, array_to_bytes,
                       _unpack(shape, dtype))
