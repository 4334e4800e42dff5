"""onnxruntime's API names: module level, capi shim, OrtValue, IOBinding, providers, end_profiling."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.errors import InvalidFeedError

F = TensorProto.FLOAT


def _model():
    x = helper.make_tensor_value_info("x", F, ["n", 3])
    outs = [helper.make_tensor_value_info(n, F, ["n", 3]) for n in ("neg", "abs")]
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Abs", ["x"], ["abs"])],
                          "g", [x], outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)


def test_module_level_names_match_onnxruntime():
    assert onnx_prepared.get_available_providers() == ["CPUExecutionProvider"]
    assert "CPUExecutionProvider" in onnx_prepared.get_all_providers()
    assert onnx_prepared.get_device() == ort.get_device() == "CPU"
    for enum_name in ("GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder"):
        ours, theirs = getattr(onnx_prepared, enum_name), getattr(ort, enum_name)
        assert {k: int(v) for k, v in ours.__members__.items()} == \
            {k: int(v) for k, v in theirs.__members__.items()}, enum_name
    onnx_prepared.disable_telemetry_events()
    onnx_prepared.enable_telemetry_events()
    onnx_prepared.set_default_logger_severity(3)
    with pytest.raises(ValueError, match="0 to 4"):
        onnx_prepared.set_default_logger_severity(7)
    so = onnx_prepared.SessionOptions()
    so.graph_optimization_level = onnx_prepared.GraphOptimizationLevel.ORT_ENABLE_ALL  # the default: no warning
    so.execution_mode = onnx_prepared.ExecutionMode.ORT_SEQUENTIAL
    assert isinstance(onnx_prepared.RunOptions().terminate, bool)


def test_import_stays_light():
    """The onnxruntime surface (enums, providers, IOBinding, capi) loads only when touched."""
    code = ("import sys, onnx_prepared; print(sorted(m for m in sys.modules if m.startswith('onnx_prepared.compat.')"
            " or m.startswith('onnx_prepared.capi')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_capi_names_and_exceptions():
    from onnx_prepared.capi import _pybind_state as C
    from onnx_prepared.capi.onnxruntime_inference_collection import IOBinding, OrtValue
    from onnx_prepared.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, NoSuchFile

    assert C.get_available_providers() == ["CPUExecutionProvider"]
    assert IOBinding is onnx_prepared.IOBinding and OrtValue is onnx_prepared.OrtValue
    sess = onnx_prepared.InferenceSession(_model())
    with pytest.raises(InvalidArgument):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(Fail):
        sess.run(None, {"x": np.zeros((2, 3), np.float64)})
    with pytest.raises(NoSuchFile):
        onnx_prepared.InferenceSession("/nonexistent/model.onnx")
    with pytest.raises(NotImplementedError, match="quantize_matmul_4bits"):
        C.quantize_matmul_4bits()


def test_missing_provider_warns_like_onnxruntime_and_falls_back_to_cpu():
    model = _model()
    ours_w, theirs_w = [], []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sess = onnx_prepared.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        ours_w = [str(x.message) for x in w if x.category is UserWarning]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ref = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        theirs_w = [str(x.message) for x in w if x.category is UserWarning]
    assert ours_w and theirs_w
    assert ours_w[0].startswith("Specified provider 'CUDAExecutionProvider' is not in available provider names.")
    assert theirs_w[0].startswith("Specified provider 'CUDAExecutionProvider' is not in available provider names.")
    assert sess.get_providers() == ref.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], -X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CPU alone, with options, is silent
        onnx_prepared.InferenceSession(model, providers=[("CPUExecutionProvider", {})])
    with pytest.raises(ValueError, match="same length"):
        onnx_prepared.InferenceSession(model, providers=["CPUExecutionProvider"], provider_options=[{}, {}])


def test_ortvalue_and_run_with_ort_values():
    v = onnx_prepared.OrtValue.ortvalue_from_numpy(X)
    assert v.shape() == [2, 3] and v.data_type() == "tensor(float)" and v.device_name() == "cpu"
    assert v.is_tensor() and v.numpy() is X
    sess = onnx_prepared.InferenceSession(_model())
    outs = sess.run_with_ort_values(["abs"], {"x": v})
    assert isinstance(outs[0], onnx_prepared.OrtValue)
    np.testing.assert_array_equal(outs[0].numpy(), np.abs(X))
    np.testing.assert_array_equal(sess.run(None, {"x": v})[1], np.abs(X))  # run() takes OrtValues too
    empty = onnx_prepared.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    empty.update_inplace(X)
    np.testing.assert_array_equal(empty.numpy(), X)
    with pytest.raises(ValueError, match="only the CPU"):
        onnx_prepared.OrtValue.ortvalue_from_numpy(X, "cuda", 0)


def test_io_binding_like_onnxruntime():
    model = _model()
    results = []
    for mod, sess in ((onnx_prepared, onnx_prepared.InferenceSession(model)),
                      (ort, ort.InferenceSession(model.SerializeToString()))):
        b = sess.io_binding()
        b.bind_cpu_input("x", X)
        b.bind_output("abs")
        b.bind_output("neg", "cpu")
        sess.run_with_iobinding(b)
        got = b.copy_outputs_to_cpu()
        assert [o.shape() for o in b.get_outputs()] == [[2, 3], [2, 3]]
        # a pre-allocated output receives the result
        dest = mod.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
        b.clear_binding_outputs()
        b.bind_ortvalue_output("neg", dest)
        sess.run_with_iobinding(b)
        results.append((got, dest.numpy().copy()))
    (ours, ours_dest), (theirs, theirs_dest) = results
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ours_dest, theirs_dest)
    b = onnx_prepared.InferenceSession(model).io_binding()
    with pytest.raises(InvalidFeedError, match="'nope'"):
        b.bind_output("nope")


def test_end_profiling_writes_the_chrome_trace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    so = onnx_prepared.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = "prof"
    sess = onnx_prepared.InferenceSession(_model(), so)
    assert sess.get_profiling_start_time_ns() > 0
    sess.run(None, {"x": X})
    name = sess.end_profiling()
    assert name.startswith("prof_") and name.endswith(".json")
    events = json.loads((tmp_path / name).read_text())
    assert isinstance(events, list) and any(e.get("ph") == "X" for e in events)
    assert sess.end_profiling() == ""  # ended, as onnxruntime's
    assert onnx_prepared.InferenceSession(_model()).end_profiling() == ""  # never enabled
