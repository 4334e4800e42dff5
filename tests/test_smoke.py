import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared as op


def test_matmul_relu_with_external_data(tmp_path):
    rng = np.random.default_rng(0)
    b = rng.standard_normal((4, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "B"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(b, "B")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    (z,) = op.InferenceSession(tmp_path / "m.onnx").run(None, {"x": x})
    np.testing.assert_allclose(z, np.maximum(x @ b, 0), rtol=1e-6)


def test_demo_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", "demo", "--dir", str(tmp_path)],
                       capture_output=True, text=True, check=True)
    assert "time to first output" in r.stdout
