"""onnxruntime-using code run with ``sys.modules['onnxruntime']`` pointing at onnx_prepared.

Two code paths: a model-zoo style script (options, providers, metadata, feeds, capi exceptions), and
onnxruntime's own pure-Python ``onnxruntime.quantization`` package (its calibrators create and run
sessions through ``onnxruntime.InferenceSession``), loaded from the installed onnxruntime's files but
importing ``onnxruntime`` as us. Each result is compared with the same code on the real onnxruntime.
Nothing new is installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared

ort_real = pytest.importorskip("onnxruntime")

# onnxruntime.quantization sets graph_optimization_level, which we accept with a one-time warning
pytestmark = pytest.mark.filterwarnings("ignore::onnx_prepared.options.OptionIgnoredWarning")


@contextlib.contextmanager
def onnxruntime_is_onnx_prepared():
    """``import onnxruntime`` (and ``onnxruntime.capi.*``) gives onnx_prepared; onnxruntime's pure-Python
    subpackages (quantization, transformers, tools) load from its own files on top of that. Restores
    ``sys.modules`` afterwards, so later tests see the real onnxruntime again."""
    saved = {k: v for k, v in sys.modules.items() if k == "onnxruntime" or k.startswith("onnxruntime.")}
    ort_dir = os.path.dirname(ort_real.__file__)
    old_path = list(onnx_prepared.__path__)
    for k in saved:
        del sys.modules[k]
    sys.modules["onnxruntime"] = onnx_prepared
    onnx_prepared.__path__[:] = [*old_path, ort_dir]  # ours first: onnxruntime.capi resolves to our shim
    try:
        yield onnx_prepared
    finally:
        onnx_prepared.__path__[:] = old_path
        for k in [k for k in sys.modules if k == "onnxruntime" or k.startswith("onnxruntime.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _conv_model(path: str) -> str:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B")
    w2 = numpy_helper.from_array(rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32) * 0.1, "W2")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "W2"], ["y"])]
    g = helper.make_graph(nodes, "zoo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [w, b, w2, shape])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


ZOO_SCRIPT = textwrap.dedent("""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(MODEL, sess_options=so, providers=ort.get_available_providers())
    meta = [(i.name, i.shape, i.type) for i in sess.get_inputs()]
    out_meta = [(o.name, o.shape, o.type) for o in sess.get_outputs()]
    inp = sess.get_inputs()[0].name
    x = np.random.default_rng(1).standard_normal((2, 3, 12, 12)).astype(np.float32)
    logits = sess.run([sess.get_outputs()[0].name], {inp: x})[0]
    top = np.argsort(-logits, axis=1)[:, :3].tolist()
    binding = sess.io_binding()
    binding.bind_cpu_input(inp, x)
    binding.bind_output(sess.get_outputs()[0].name)
    sess.run_with_iobinding(binding)
    bound = binding.copy_outputs_to_cpu()[0]
    try:
        sess.run(None, {inp: x[:, :2]})
        rejected = False
    except InvalidArgument:
        rejected = True
    RESULT = dict(device=ort.get_device(), providers=sess.get_providers(), meta=meta, out_meta=out_meta,
                  logits=logits, top=top, bound=bound, rejected=rejected)
""")


def _run_script(path: str) -> dict:
    scope = {"MODEL": path}
    exec(compile(ZOO_SCRIPT, "zoo_script.py", "exec"), scope)
    return scope["RESULT"]


def test_zoo_style_script(tmp_path):
    path = _conv_model(str(tmp_path / "zoo.onnx"))
    theirs = _run_script(path)
    with onnxruntime_is_onnx_prepared():
        ours = _run_script(path)
    assert sys.modules["onnxruntime"] is ort_real
    for key in ("device", "meta", "out_meta", "top", "rejected"):
        assert ours[key] == theirs[key], key
    assert ours["providers"] == ["CPUExecutionProvider"] and "CPUExecutionProvider" in theirs["providers"]
    np.testing.assert_allclose(ours["logits"], theirs["logits"], atol=1e-4, rtol=1e-3)
    np.testing.assert_allclose(ours["bound"], theirs["logits"], atol=1e-4, rtol=1e-3)


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader protocol: get_next() until None."""

    def __init__(self, n: int = 4):
        rng = np.random.default_rng(2)
        self._data = iter([{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self._data, None)


def _calibrate(model: str, folder: str, method_name: str) -> dict:
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    cal = create_calibrator(model, augmented_model_path=os.path.join(folder, f"aug_{method_name}.onnx"),
                            calibrate_method=getattr(CalibrationMethod, method_name))
    cal.collect_data(_Reader())
    ranges = cal.compute_data()
    out = {}
    for name, td in ranges.data.items():
        lo, hi = td.range_value if hasattr(td, "range_value") else (td.lowest, td.highest)
        out[name] = np.concatenate([np.ravel(lo), np.ravel(hi)]).astype(np.float64)
    return out


@pytest.mark.parametrize("method", ["MinMax", "Entropy"])
def test_onnxruntime_quantization_calibrates_through_onnx_prepared(tmp_path, method):
    model = _conv_model(str(tmp_path / "model.onnx"))
    (tmp_path / "ref").mkdir()
    (tmp_path / "ours").mkdir()
    theirs = _calibrate(model, str(tmp_path / "ref"), method)
    with onnxruntime_is_onnx_prepared():
        import onnxruntime.quantization.calibrate as cal_mod

        assert cal_mod.onnxruntime is onnx_prepared  # its sessions are ours
        ours = _calibrate(model, str(tmp_path / "ours"), method)
    assert sorted(ours) == sorted(theirs) and len(ours) >= 4
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], atol=1e-4, rtol=1e-3, err_msg=name)


def test_quantize_static_with_our_calibration_runs_like_onnxruntime(tmp_path):
    """quantize_static (QDQ) calibrated through us; the quantized model then runs in both runtimes."""
    model = _conv_model(str(tmp_path / "model.onnx"))
    out = str(tmp_path / "model_qdq.onnx")
    with onnxruntime_is_onnx_prepared():
        from onnxruntime.quantization import QuantFormat, quantize_static

        quantize_static(model, out, _Reader(), quant_format=QuantFormat.QDQ)
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    x = np.random.default_rng(3).standard_normal((2, 3, 12, 12)).astype(np.float32)
    ref = ort_real.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnx_prepared.InferenceSession(out).run(None, {"x": x})[0]
    scale = np.abs(ref).max()
    # onnxruntime fuses Q/DQ around Conv into integer kernels; rounding may differ by a quantization step
    np.testing.assert_allclose(got, ref, atol=0.05 * scale)
