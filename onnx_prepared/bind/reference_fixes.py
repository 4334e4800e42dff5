"""Ops where ``onnx.reference`` computes something other than onnxruntime, replaced for the fallback.

Each class is named like the op it replaces and serves every opset version of it (the adapter looks
patches up by op name, before the reference's versioned classes), so version-dependent semantics are
decided here from the model's opset and the node itself, never from schema defaults the reference
fills in:

- BatchNormalization: inference mode (running statistics) unless the node asks for training, as
  onnxruntime decides it: ``training_mode`` from opset 14, more than one output before. The reference's
  BatchNormalization_9 uses batch statistics whenever ``momentum`` is set, which its schema default
  always sets; BatchNormalization_6 trains unless ``is_test`` and returns its outputs nested as one.
- GlobalMaxPool / GlobalAveragePool: reduce every axis after N and C at every rank (the reference's
  GlobalMaxPool reduces the wrong axes on 3-D and 5-D input).
- Hardmax before opset 13: the input is coerced to 2-D at ``axis`` (default 1) and the first maximum of
  each row wins (the reference implements only Hardmax-13's single axis).
"""

from __future__ import annotations

import numpy as np
from onnx import helper
from onnx.reference.op_run import OpRun


def _opset(op: OpRun) -> int:
    return int(op.run_params.get("opsets", {}).get("", 10**6)) if isinstance(op.run_params, dict) else 10**6


def _node_attr(op: OpRun, name: str, default):
    for a in op.onnx_node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _per_channel(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A [C] parameter broadcast over x [N, C, D1, ...]; spatial=0 parameters [C, D1, ...] are used as given."""
    return v.reshape(-1, *((1,) * (x.ndim - 2))) if v.ndim == 1 else v


class BatchNormalization(OpRun):
    op_domain = ""

    def _run(self, x, scale, bias, mean, var, **_attrs):
        eps = float(_node_attr(self, "epsilon", 1e-5))
        outputs = [o for o in self.onnx_node.output]
        while outputs and not outputs[-1]:
            outputs.pop()
        if _opset(self) >= 14:
            training = bool(_node_attr(self, "training_mode", 0))
        else:
            training = len(outputs) > 1
        if not training:
            y = (_per_channel(scale, x) * (x - _per_channel(mean, x)) / np.sqrt(_per_channel(var, x) + eps)
                 + _per_channel(bias, x))
            return (y.astype(x.dtype), *([None] * (len(outputs) - 1)))
        momentum = float(_node_attr(self, "momentum", 0.9))
        axes = (0, *range(2, x.ndim))
        saved_mean = x.mean(axis=axes)
        saved_var = x.var(axis=axes)
        y = (_per_channel(scale, x) * (x - _per_channel(saved_mean, x)) / np.sqrt(_per_channel(saved_var, x) + eps)
             + _per_channel(bias, x))
        running_mean = (mean * momentum + saved_mean * (1 - momentum)).astype(x.dtype)
        running_var = (var * momentum + saved_var * (1 - momentum)).astype(x.dtype)
        res = [y.astype(x.dtype), running_mean, running_var, saved_mean.astype(x.dtype), saved_var.astype(x.dtype)]
        return tuple(res[: len(outputs)])


class GlobalMaxPool(OpRun):
    op_domain = ""

    def _run(self, x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


class GlobalAveragePool(OpRun):
    op_domain = ""

    def _run(self, x):
        return (x.mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype),)


class Hardmax(OpRun):
    op_domain = ""

    def _run(self, x, axis=None):
        old = _opset(self) < 13
        axis = int(_node_attr(self, "axis", 1 if old else -1))
        axis = axis + x.ndim if axis < 0 else axis
        if old:
            rows = int(np.prod(x.shape[:axis], dtype=np.int64))
            flat = x.reshape(rows, -1)
            out = np.zeros_like(flat)
            out[np.arange(rows), np.argmax(flat, axis=1)] = 1
            return (out.reshape(x.shape),)
        idx = np.expand_dims(np.argmax(x, axis=axis), axis)
        out = np.zeros_like(x)
        np.put_along_axis(out, idx, 1, axis=axis)
        return (out,)


FIXES: dict[tuple[str, str], type[OpRun]] = {
    ("", "BatchNormalization"): BatchNormalization,
    ("", "GlobalMaxPool"): GlobalMaxPool,
    ("", "GlobalAveragePool"): GlobalAveragePool,
    ("", "Hardmax"): Hardmax,
}
