"""A DequantizeLinear of initializers only (``quantize_dynamic``'s int8 embedding tables, ahead of their
Gather) computed once, as a prepared object, instead of in every run.

onnxruntime folds such constant subgraphs at session creation. Here the prepack rule does it: the
dequantized tensor is the "packed" form of the node's inputs (its own layout key, so it is persisted in
the prepared cache like any prepacked weight), and the run returns it read-only (no kernel writes into
its inputs). Only small 8-bit tensors are folded (:data:`FOLD_MAX_BYTES`): the float tensor is 4x the
quantized bytes (8x for 4 bits), which would undo the point of quantizing a large table.
"""

from __future__ import annotations

import math

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.kernels.prepack import PrepackSpec, array_to_bytes, prepack_rule
from onnx_prepared.kernels.quantize import dequantize_linear

#: the largest dequantized tensor folded (bytes)
FOLD_MAX_BYTES = 4 << 20


@prepack_rule("DequantizeLinear")
def dequantize_constant_rule(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None:
    positions = tuple(i for i, name in enumerate(node.input) if name)
    if not positions or positions[:2] != (0, 1) or set(positions) - set(const_shapes):
        return None
    shape, dtype = const_shapes[0]
    if dtype not in ("int8", "uint8"):  # 4-bit tables stay packed: folded they would be 8x their bytes
        return None
    axis, block_size = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    output_dtype = int(attrs.get("output_dtype", 0))
    try:
        out = np.dtype(onnx.tensor_dtype_to_np_dtype(output_dtype)) if output_dtype else np.dtype(const_shapes[1][1])
    except (KeyError, TypeError, ValueError):
        return None
    shape = tuple(int(d) for d in shape)
    if math.prod(shape) * out.itemsize > FOLD_MAX_BYTES:
        return None

    def pack(*arrays: np.ndarray) -> np.ndarray:
        (y,) = dequantize_linear(*arrays, axis=axis, block_size=block_size, output_dtype=output_dtype)
        y = np.ascontiguousarray(y)
        y.flags.writeable = False
        return y

    def from_bytes(buf: np.ndarray) -> np.ndarray:
        return buf.view(out).reshape(shape)

    def run(folded: np.ndarray) -> tuple[np.ndarray]:
        return (folded,)

    layout = (f"dqfold-{dtype}-{out.name}-{'x'.join(map(str, shape))}-axis{axis}-bs{block_size}"
              f"-zp{int(len(positions) > 2)}")
    return PrepackSpec(positions, layout, pack, run, array_to_bytes, from_bytes, math.prod(shape) * out.itemsize)
