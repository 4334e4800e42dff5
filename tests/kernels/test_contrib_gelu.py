"""com.microsoft BiasGelu / Gelu against onnxruntime (float32: within an ulp, see kernels/contrib_gelu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import contrib_gelu as G


def _both(op, ins):
    import onnxruntime as ort

    import onnx_prepared

    names = [f"x{i}" for i in range(len(ins))]
    node = helper.make_node(op, names, ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
                                            for n, v in zip(names, ins)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    feeds = dict(zip(names, ins))
    sess = onnx_prepared.InferenceSession(m.SerializeToString())
    assert not any(k.is_fallback for k in sess._rt.resolved.kernels)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return sess.run(None, feeds)[0], ref


@pytest.mark.parametrize("shape", [(2, 8, 64), (3, 37), (1, 5, 1000)])
def test_bias_gelu_and_gelu_match_onnxruntime(shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:6] = [0.0, -0.0, 9.0, -9.0, 1e-30, -40.0]
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    for ours, ref in (_both("BiasGelu", [x, b]), _both("Gelu", [x])):
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=2e-7, atol=1e-6)


def test_bias_gelu_refuses_a_bias_of_another_width():
    with pytest.raises(KernelError, match="last dimension"):
        G.bias_gelu(np.zeros((2, 4), np.float32), np.zeros(3, np.float32))
