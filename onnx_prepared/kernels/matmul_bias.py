"""``onnx_prepared::MatMulBias(A, W, bias)``: MatMul(A, W) + Add(bias) in one kernel call
(resolve/fusions.py writes it for a float32 initializer W [K, N] and bias [N]).

Small float32 products (up to :data:`NATIVE_MAX_MACS`) take one native call with the bias in its
epilogue (``_native/encoder_gemm.c``: each output one sum over k in order, as MLAS's SGEMM kernels
accumulate); larger ones are one BLAS call on A viewed as ``[rows, K]`` (numpy's stacked matmul of a
3-D A runs one GEMM per leading index), the bias added in place. Both are within rounding of the
unfused MatMul and Add. With W constant it is prepacked as MatMul's is (the same ``[K, N]`` panel and layout key,
so a MatMul and a MatMulBias of one W share the prepared object).
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.kernels import native
from onnx_prepared.kernels.gemm_prepacked import unpack_array
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.registry import kernel

#: products up to this many multiply-adds take the native kernel; larger ones BLAS (its threads and
#: blocking win there; below, its fixed cost is most of the call)
NATIVE_MAX_MACS = 1 << 18
_F32 = np.dtype(np.float32)


def _product(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``a @ w + bias`` (a new array; ``bias`` None: none)."""
    shape = a.shape
    if len(shape) >= 1 and a.dtype == w.dtype and w.ndim == 2 and shape[-1] == w.shape[0]:
        k, n = w.shape
        ext = native._ext
        rows = a.size // k if k else 0
        if (ext is not None and a.dtype == np.float32 and rows * k * n <= NATIVE_MAX_MACS and k
                and (bias is None or (bias.dtype == np.float32 and bias.shape == (n,)))):
            y = np.empty(shape[:-1] + (n,), np.float32)
            c = np.ascontiguousarray
            ext.gemm_bias_f32(c(a), c(w), None if bias is None else c(bias), y, native._scratch(64 * k), rows, k, n)
            return y
        if len(shape) >= 2:
            y = (a.reshape(-1, k) @ w).reshape(shape[:-1] + (n,))
            if bias is not None:
                y += bias
            return y
    y = np.asarray(np.matmul(a, w))  # anything else: MatMul's own semantics (and its errors), then Add's
    return y if bias is None else np.asarray(np.add(y, bias))


@kernel("MatMulBias", since=1, domain="onnx_prepared")
def matmul_bias(a: np.ndarray, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
    return (_product(a, w, bias),)


def matmul_bias_packed(packed: np.ndarray, a: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
    return (_product(a, packed, bias),)


@prepack_rule("MatMulBias", domain="onnx_prepared")
def matmul_bias_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    if 1 not in const_inputs or 0 in const_inputs:
        return None
    shape, dtype = const_shapes[1]
    if len(shape) != 2 or dtype not in ("float32", "float64"):
        return None
    layout = f"matmul-b-kn-{dtype}-k{shape[0]}-n{shape[1]}"
    return PrepackSpec((1,), layout, np.ascontiguousarray, _bound(*shape) if dtype == "float32" else matmul_bias_packed,
                       array_to_bytes, unpack_array(shape, dtype))


def _bound(k: int, n: int):
    """The packed kernel for a float32 [k, n] panel: the checks the panel settles made once (it is
    contiguous and float32), so a small product costs the native call and little else."""
    bias_shape = (n,)

    def matmul_bias_f32(packed: np.ndarray, a: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
        ext = native._ext
        shape = a.shape
        if ext is not None and a.dtype is _F32 and shape and shape[-1] == k and bias.dtype is _F32:
            rows = a.size // k
            if rows * k * n <= NATIVE_MAX_MACS and bias.shape == bias_shape:
                y = np.empty(shape[:-1] + bias_shape, _F32)
                c = np.ascontiguousarray
                ext.gemm_bias_f32(c(a), packed, c(bias), y, native._scratch(64 * k), rows, k, n)
                return (y,)
        return (_product(a, packed, bias),)

    return matmul_bias_f32
