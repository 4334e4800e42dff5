"""An initializer the graph also lists as an input (IR version 4 on) is a default a run may override:
resolution neither folds nor prepacks it, so a feed for it gives what onnxruntime computes."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared

RNG = np.random.default_rng(3)
W = RNG.standard_normal((16, 16)).astype(np.float32)
C = RNG.standard_normal(16).astype(np.float32)
X = RNG.standard_normal((2, 16)).astype(np.float32)
CW = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
BN = {n: RNG.uniform(0.5, 1.5, 4).astype(np.float32) for n in ("scale", "bias", "mean", "var")}
XI = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)


def _save(folder, nodes, inputs, outputs, inits, name, ir_version=8) -> str:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = ir_version
    path = str(folder / name)
    onnx.save(m, path)
    return path


def _gemm(folder, ir_version=8) -> str:
    """y = Gemm(x, W0, c0), W0 also a graph input."""
    return _save(folder, [helper.make_node("Gemm", ["x", "W0", "c0"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16]),
                  helper.make_tensor_value_info("W0", TensorProto.FLOAT, [16, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
                 [numpy_helper.from_array(W, "W0"), numpy_helper.from_array(C, "c0")], f"gemm{ir_version}.onnx",
                 ir_version)


def _conv_bn(folder) -> str:
    """y = BatchNormalization(Conv(x, cw), scale, ...), the BN scale also a graph input."""
    nodes = [helper.make_node("Conv", ["x", "cw"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["h", "scale", "bias", "mean", "var"], ["y"])]
    inits = [numpy_helper.from_array(CW, "cw")] + [numpy_helper.from_array(v, n) for n, v in BN.items()]
    return _save(folder, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                 helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits, "conv_bn.onnx")


def _ort(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("build, feeds, override", [
    (_gemm, {"x": X}, {"W0": np.eye(16, dtype=np.float32)}),
    (_conv_bn, {"x": XI}, {"scale": np.full(4, 2.0, np.float32)}),
])
def test_a_fed_default_is_used_as_onnxruntime_uses_it(tmp_path, build, feeds, override):
    path = build(tmp_path)
    s = onnx_prepared.InferenceSession(path)
    (name,) = override
    resolved = s.runtime.resolved
    assert resolved.removed_nodes == 0 and resolved.node_count == len(onnx.load(path).graph.node)  # nothing folded
    assert all(name not in r.sources for r in resolved.requirements if not r.key.is_raw)  # nor packed
    for f in (feeds, {**feeds, **override}, feeds):  # the default again after an override
        got = s.run(None, f)[0]
        np.testing.assert_allclose(got, _ort(path, f), rtol=1e-5, atol=1e-5)
        assert np.array_equal(got, s.run(None, f)[0])


def test_before_ir_version_4_inputs_do_not_make_initializers_overridable(tmp_path):
    """IR version 3 lists every initializer among the inputs by convention: they stay constants."""
    s = onnx_prepared.InferenceSession(_gemm(tmp_path, ir_version=3))
    assert s.runtime.resolved.kernel_choices[0].startswith("prepacked:")
    np.testing.assert_allclose(s.run(None, {"x": X})[0], X @ W + C, rtol=1e-5, atol=1e-5)
