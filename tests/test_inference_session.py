"""InferenceSession: onnxruntime's surface over prepared execution."""

import asyncio
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_prepared as op
from onnx_prepared.errors import InvalidFeedError, KernelError
from tests.helpers.models import gemm_mlp, reference_mlp

X = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)


def test_run_async_calls_back_like_onnxruntime(tmp_path):
    path = gemm_mlp(tmp_path, layers=2)
    sess = op.InferenceSession(path)
    done = threading.Event()
    got = {}

    def callback(results, user_data, err):
        got.update(results=results, user_data=user_data, err=err)
        done.set()

    sess.run_async(None, {"x": X}, callback, "token")
    assert done.wait(20)
    assert got["err"] == "" and got["user_data"] == "token"
    np.testing.assert_allclose(got["results"][0], reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_run_async_reports_errors_through_the_callback(tmp_path):
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape0")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    sess = op.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    bad = {"x": np.ones((2, 4), np.float32), "shape": np.array([3, 3], np.int64)}
    done = threading.Event()
    got = {}

    def callback(results, user_data, err):
        got.update(results=results, err=err)
        done.set()

    sess.run_async(None, bad, callback)  # 8 elements cannot become [3, 3]
    assert done.wait(20)
    assert got["results"] is None and got["err"].startswith("KernelError") and "reshape0" in got["err"]
    with pytest.raises(KernelError, match="reshape0"):
        sess.run(None, bad)


def test_handle_is_awaitable_and_outputs_are_selected_by_name(tmp_path):
    path = gemm_mlp(tmp_path, layers=2)
    sess = op.InferenceSession(path)
    out_name = sess.get_outputs()[0].name

    async def main():
        return await sess.runtime.run_async({"x": X})

    (y,) = asyncio.run(main())
    np.testing.assert_array_equal(y, sess.run([out_name], {"x": X})[0])
    with pytest.raises(InvalidFeedError, match="nope"):
        sess.run(["nope"], {"x": X})
    with pytest.raises(InvalidFeedError, match="missing input 'x'"):
        sess.run(None, {})
    with pytest.raises(InvalidFeedError, match="dtype float64"):
        sess.run(None, {"x": X.astype(np.float64)})
    assert [i.name for i in sess.get_inputs()] == ["x"] and sess.get_inputs()[0].type == "tensor(float)"
    assert sess.get_providers() == ["CPUExecutionProvider"]
