"""The extension's tiling copies (im2col.c): ConvTranspose's col2im at stride = kernel with its bias
(``col2im_tiled``, PackedConvTranspose._tiled) and Resize's nearest repetition by whole factors of the
last two axes (``nearest_repeat2d``, resize._repeat_copy). Against the numpy paths they replace (the
same values) and onnxruntime through models on every compute path, over several runs."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import conv_transpose as ct
from onnx_prepared.kernels import native
from onnx_prepared.kernels import resize as rz
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path
from tests.helpers.models import conv_transpose_model

RNG = np.random.default_rng(17)
needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


@needs_ext
@pytest.mark.parametrize(("n", "m", "k", "hw"), [(1, 16, (2, 2), (8, 8)), (2, 3, (3, 2), (4, 5)),
                                                 (1, 2, (1, 3), (3, 1))])
@pytest.mark.parametrize("bias", [False, True])
def test_col2im_tiled_equals_the_numpy_tile(n, m, k, hw, bias):
    cols = RNG.standard_normal((n, m * k[0] * k[1], hw[0] * hw[1])).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32) if bias else None
    out = (hw[0] * k[0], hw[1] * k[1])
    ref = ct._tile(cols.reshape(n, m, k[0] * k[1], *hw), n, m, k, hw, out)
    if bias:
        ref = ref + b.reshape(m, 1, 1)
    y = np.empty((n, m, *out), np.float32)
    native._ext.col2im_tiled(cols, b, y, np.array([n, m, *k, *hw], np.int64))
    np.testing.assert_array_equal(y, ref)


@needs_ext
def test_tiling_copies_check_their_buffers():
    ext = native._ext
    with pytest.raises(ValueError, match="col2im_tiled"):
        ext.col2im_tiled(np.zeros(8, np.float32), None, np.zeros(16, np.float32), np.array([1, 1, 2, 2, 2, 2]))
    with pytest.raises(ValueError, match="col2im_tiled"):
        ext.col2im_tiled(np.zeros(16, np.float32), None, np.zeros(16, np.float32), np.array([1, 1, 2, 2, 2, 0]))
    with pytest.raises(ValueError, match="nearest_repeat2d"):
        ext.nearest_repeat2d(np.zeros(4, np.float32), np.zeros(8, np.float32), np.array([1, 2, 2, 2, 2]))
    with pytest.raises(ValueError, match="nearest_repeat2d"):
        ext.nearest_repeat2d(np.zeros(4, np.float64), np.zeros(16, np.float64), np.array([1, 2, 2, 2, 2]))


def _convt_model(xs, ws, attrs, bias: bool) -> onnx.ModelProto:
    return conv_transpose_model(RNG, xs, ws, attrs, bias)


def _runs(model, feeds: dict, n_runs: int = 3):
    import onnxruntime as ort

    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, os.path.join(d, "m.onnx"))
        with RuntimeSession(os.path.join(d, "m.onnx")) as s:
            for _ in range(n_runs):  # cold, then prepared with the plan made, then the plan used
                got = s.run(feeds)
                for g, e in zip(got, expected):
                    assert g.shape == e.shape and g.dtype == e.dtype and g.flags.c_contiguous
                    np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("xs", "ws", "attrs", "bias"), [
    ((1, 16, 8, 8), (16, 16, 2, 2), {"strides": [2, 2]}, True),  # UNet's upsampling
    ((2, 6, 5, 7), (6, 3, 3, 2), {"strides": [3, 2]}, False),
    ((1, 4, 3, 5), (4, 3, 2, 2), {"strides": [2, 2], "group": 2}, True),
])
def test_tiled_conv_transpose_matches_onnxruntime(path, xs, ws, attrs, bias):
    _runs(_convt_model(xs, ws, attrs, bias), {"x": RNG.standard_normal(xs).astype(np.float32)})


@needs_ext
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("reps", [[1, 1, 2, 2], [1, 1, 3, 1], [1, 1, 1, 2], [1, 2, 2, 3]])
def test_nearest_repeat_copy_equals_numpy_repeat(dtype, reps):
    x = (RNG.standard_normal((2, 3, 4, 5)) * 100).astype(dtype)
    out = tuple(s * r for s, r in zip(x.shape, reps))
    ref = x
    for axis, r in enumerate(reps):
        ref = np.repeat(ref, r, axis=axis)
    np.testing.assert_array_equal(rz._repeat_copy(x, reps, out), ref)


def _resize_model(scales) -> onnx.ModelProto:
    """UNet's export: the scales a Concat of two Constants (nothing folds it), roi an empty Constant."""
    half = len(scales) // 2
    nodes = [
        helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(np.array(scales[:half], np.float32))),
        helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(np.array(scales[half:], np.float32))),
        helper.make_node("Concat", ["a", "b"], ["scales"], axis=0),
        helper.make_node("Constant", [], ["roi"], value=numpy_helper.from_array(np.array([], np.float32))),
        helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    ]
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 2, 3], [1, 1, 1.5, 2]])
def test_resize_with_runtime_scales_matches_onnxruntime(path, scales):
    model = _resize_model(scales)
    for shape in [(1, 8, 16, 16), (2, 3, 5, 7)]:  # a plan per input shape
        _runs(model, {"x": RNG.standard_normal(shape).astype(np.float32)})
