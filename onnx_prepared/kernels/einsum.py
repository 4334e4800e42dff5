"""Einsum on ``np.einsum`` with contraction-order optimization (BLAS for the matmul-shaped parts).

Half-precision operands are contracted in float32 and cast back.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.registry import kernel

_HALF = frozenset({"float16", "bfloat16"})


@kernel("Einsum", since=12)
def einsum(*inputs: np.ndarray, equation: str) -> tuple[np.ndarray]:
    if not inputs:
        raise KernelError("Einsum: needs at least one input")
    dtype = inputs[0].dtype
    ops = [x.astype(np.float32) for x in inputs] if dtype.itemsize == 2 and dtype.name in _HALF else list(inputs)
    eq = equation.replace(" ", "")
    try:
        y = np.einsum(eq, *ops, optimize=len(ops) > 1)
    except ValueError as e:
        raise KernelError(f"Einsum: equation {equation!r} does not fit input shapes "
                          f"{[list(x.shape) for x in inputs]}: {e}") from e
    return (np.asarray(y).astype(dtype, copy=False),)
