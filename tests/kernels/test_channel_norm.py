"""BatchNormalization (inference at every opset, training_mode at 14+) and InstanceNormalization."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from onnx_prepared.errors import KernelError
from tests.kernels.onnx_node_check import check, check_ort, run_ours

RNG = np.random.default_rng(2)


def _bn_inputs(shape, dtype=np.float32):
    c = shape[1]
    x = RNG.standard_normal(shape).astype(dtype)
    s, b, m = (RNG.standard_normal(c).astype(dtype) for _ in range(3))
    v = (np.abs(RNG.standard_normal(c)) + 0.1).astype(dtype)
    return [x, s, b, m, v]


@pytest.mark.parametrize("opset", [7, 9, 11, 13, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 4, 5, 6), (2, 2, 3, 4, 5)])
def test_batch_norm_uses_running_statistics_at_every_opset(opset, shape):
    """onnx.reference's BatchNormalization_9 normalizes with batch statistics (opsets 9-13): not us."""
    check_ort("BatchNormalization", _bn_inputs(shape), opset=opset, epsilon=1e-3)


def test_batch_norm_float16_and_float64():
    check_ort("BatchNormalization", _bn_inputs((1, 4, 5, 6), np.float16), opset=15, rtol=1e-2, atol=1e-2)
    check_ort("BatchNormalization", _bn_inputs((1, 4, 5, 6), np.float64), opset=15)


def test_batch_norm_opset_6_attributes_and_per_element_statistics():
    inputs = _bn_inputs((2, 3, 4))
    check("BatchNormalization", inputs, opset=6, rtol=1e-5, atol=1e-6, is_test=1, spatial=1)
    x = inputs[0]
    per_elem = [RNG.standard_normal((3, 4)).astype(np.float32) for _ in range(3)]
    per_elem.append((np.abs(RNG.standard_normal((3, 4))) + 0.1).astype(np.float32))
    (y,) = run_ours("BatchNormalization", [x, *per_elem], opset=6, is_test=1, spatial=0)
    s, b, m, v = per_elem
    np.testing.assert_allclose(y, s * (x - m) / np.sqrt(v + 1e-5) + b, rtol=1e-5, atol=1e-6)


def test_batch_norm_training_mode_matches_reference():
    check("BatchNormalization", _bn_inputs((2, 3, 4, 5)), opset=15, n_outputs=3, rtol=1e-5, atol=1e-6,
          training_mode=1, momentum=0.8)


def test_batch_norm_training_outputs_before_opset_14_are_refused():
    with pytest.raises(KernelError, match="training outputs"):
        run_ours("BatchNormalization", _bn_inputs((2, 3, 4)), opset=9, n_outputs=5)


def test_batch_norm_mismatched_channels_is_a_clear_error():
    inputs = _bn_inputs((2, 3, 4))
    inputs[1] = inputs[1][:2]
    with pytest.raises(KernelError, match="scale of shape"):
        run_ours("BatchNormalization", inputs, opset=15)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 5, 6), (2, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_instance_norm(shape, dtype):
    x = (RNG.standard_normal(shape) * 3 + 1).astype(dtype)
    s, b = RNG.standard_normal(shape[1]).astype(dtype), RNG.standard_normal(shape[1]).astype(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-4
    check_ort("InstanceNormalization", [x, s, b], opset=6, rtol=tol, atol=tol, epsilon=1e-4,
              out_elem=TensorProto.FLOAT16 if dtype == np.float16 else None)
