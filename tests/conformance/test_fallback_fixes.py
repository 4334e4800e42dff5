"""The onnx.reference fallback's fixed ops (bind/reference_fixes.py) against onnxruntime, called through
the fallback directly: fast kernels of the same ops would hide them from model-level tests."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_prepared.bind.reference import bind_fallback

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _compare(node, opset, inputs):
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, F, list(v.shape)) for n, v in zip(node.input, inputs)],
        [helper.make_tensor_value_info(n, F, None) for n in node.output]),
        opset_imports=[helper.make_opsetid("", opset)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the node itself, not a fusion
    ref = ort.InferenceSession(model.SerializeToString(), so).run(None, dict(zip(node.input, inputs)))
    call = bind_fallback(node, {"": opset}, {}, ())
    got = call(*inputs)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-4)


def _bn_inputs(c=3, shape=(2, 3, 4, 5)):
    return [RNG.standard_normal(shape).astype(np.float32), (RNG.random(c) + 0.5).astype(np.float32),
            RNG.standard_normal(c).astype(np.float32), RNG.standard_normal(c).astype(np.float32),
            (RNG.random(c) + 0.5).astype(np.float32)]


@pytest.mark.parametrize("opset", [7, 9, 11, 13, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (2, 3, 4, 5), (1, 3, 2, 2, 2)])
def test_batchnorm_inference_mode_at_every_opset(opset, shape):
    attrs = {"epsilon": 1e-3}
    if opset >= 14:
        attrs["training_mode"] = 0
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], **attrs)
    _compare(node, opset, _bn_inputs(3, shape))


def test_batchnorm_without_training_mode_attribute_at_15():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], momentum=0.7)
    _compare(node, 15, _bn_inputs())


def test_batchnorm_training_mode_outputs_running_statistics():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                            momentum=0.8)
    _compare(node, 15, _bn_inputs())


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4)])
@pytest.mark.parametrize("opset", [7, 13, 22])
def test_global_pools_reduce_every_spatial_axis(op, shape, opset):
    _compare(helper.make_node(op, ["x"], ["y"]), opset, [RNG.standard_normal(shape).astype(np.float32)])


@pytest.mark.parametrize("opset", [7, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
def test_hardmax_per_opset(opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 0, :2] = 5.0  # ties: the first maximum wins
    _compare(helper.make_node("Hardmax", ["x"], ["y"], **attrs), opset, [x])
