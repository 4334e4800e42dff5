"""Per-channel normalizations of NC... tensors: BatchNormalization (inference, every opset) and
InstanceNormalization.

BatchNormalization folds scale, bias, mean and variance into one multiplier and one shift per channel
(``y = x * a + b``), computed in float32 for half-precision inputs. It never uses batch statistics
unless ``training_mode=1`` (opset 14+) asks for them. NOTE: onnx.reference's BatchNormalization_9 uses
batch statistics whenever the schema fills in its default momentum, i.e. always: that is why this op
must not fall back. Opset 6's ``is_test`` is ignored (exported models are inference models) and
``spatial=0`` takes per-element statistics of shape ``X.shape[1:]``.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels.registry import kernel


def _param(v: np.ndarray, x: np.ndarray, what: str, dtype) -> np.ndarray:
    c = x.shape[1]
    v = v.astype(dtype, copy=False)
    if v.size == c:
        return v.reshape((c,) + (1,) * (x.ndim - 2))
    if v.size == sp.prod(x.shape[1:]):  # spatial=0 (opsets < 9): one statistic per element
        return v.reshape(x.shape[1:])
    raise KernelError(f"BatchNormalization: {what} of shape {list(v.shape)} does not match input channels {c} "
                      f"(input shape {list(x.shape)})")


@kernel("BatchNormalization", since=1)
def batch_normalization(
    X: np.ndarray, scale: np.ndarray, B: np.ndarray, input_mean: np.ndarray, input_var: np.ndarray, *,
    epsilon: float = 1e-5, momentum: float = 0.9, spatial: int = 1, is_test: int = 0,
    consumed_inputs: list[int] | None = None, training_mode: int = 0, n_outputs: int = 1,
) -> tuple:
    if X.ndim < 2:
        raise KernelError(f"BatchNormalization: input must be at least 2-D, got shape {list(X.shape)}")
    dtype = X.dtype
    wd = sp.work_dtype(dtype)
    xw = X.astype(wd, copy=False)
    if training_mode:
        return _training(xw, dtype, scale, B, input_mean, input_var, epsilon, momentum)
    if n_outputs > 1:
        raise KernelError("BatchNormalization: the node asks for training outputs (mean, var, saved_mean, "
                          "saved_var), which only training mode computes; not supported before opset 14")
    mean, var = _param(input_mean, X, "mean", wd), _param(input_var, X, "var", wd)
    a = _param(scale, X, "scale", wd) / np.sqrt(var + wd.type(epsilon))
    b = _param(B, X, "B", wd) - mean * a
    y = xw * a
    y += b
    return (y.astype(dtype, copy=False),)


def _training(xw, dtype, scale, B, input_mean, input_var, epsilon, momentum) -> tuple:
    """training_mode=1 (opset 14+): normalize with batch statistics, return updated running statistics."""
    wd = xw.dtype
    axes = (0,) + tuple(range(2, xw.ndim))
    shape = (xw.shape[1],) + (1,) * (xw.ndim - 2)
    mean = xw.mean(axis=axes)
    var = xw.var(axis=axes)
    a = scale.astype(wd).reshape(shape) / np.sqrt(var.reshape(shape) + wd.type(epsilon))
    y = (xw - mean.reshape(shape)) * a + B.astype(wd).reshape(shape)
    m = wd.type(momentum)
    run_mean = input_mean.astype(wd) * m + mean * (1 - m)
    run_var = input_var.astype(wd) * m + var * (1 - m)
    return (y.astype(dtype, copy=False), run_mean.astype(input_mean.dtype, copy=False),
            run_var.astype(input_var.dtype, copy=False))


@kernel("InstanceNormalization", since=1)
def instance_normalization(
    input: np.ndarray, scale: np.ndarray, B: np.ndarray, *, epsilon: float = 1e-5,
    consumed_inputs: list[int] | None = None,
) -> tuple[np.ndarray]:
    x = input
    if x.ndim < 3:
        raise KernelError(f"InstanceNormalization: input must be at least 3-D, got shape {list(x.shape)}")
    c = x.shape[1]
    if scale.size != c or B.size != c:
        raise KernelError(f"InstanceNormalization: scale {list(scale.shape)} and B {list(B.shape)} must have "
                          f"{c} values (input shape {list(x.shape)})")
    wd = sp.work_dtype(x.dtype)
    xw = x.astype(wd, copy=False)
    axes = tuple(range(2, x.ndim))
    shape = (c,) + (1,) * (x.ndim - 2)
    mean = xw.mean(axis=axes, keepdims=True)
    y = xw - mean
    var = np.mean(np.square(y), axis=axes, keepdims=True)
    a = scale.astype(wd, copy=False).reshape(shape) / np.sqrt(var + wd.type(epsilon))
    y *= a
    y += B.astype(wd, copy=False).reshape(shape)
    return (y.astype(x.dtype, copy=False),)
