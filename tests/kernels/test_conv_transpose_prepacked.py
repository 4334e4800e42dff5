"""ConvTranspose with a constant float32 weight runs prepacked (``convT-w-p16``: W^T in the SGEMM's
panels): against onnxruntime on every compute path, first and later runs, tiled (stride = kernel) and
overlapping geometries; the tiled col2im's pair interleave against the plain transpose."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest

from onnx_prepared.kernels import conv_transpose as ct
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path
from tests.helpers.models import conv_transpose_model

RNG = np.random.default_rng(13)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _model(xs, ws, attrs, bias: bool) -> onnx.ModelProto:
    return conv_transpose_model(RNG, xs, ws, attrs, bias)


@pytest.mark.parametrize(("xs", "ws", "attrs", "bias"), [
    ((1, 16, 8, 8), (16, 16, 2, 2), {"strides": [2, 2]}, True),  # UNet's upsampling: tiled
    ((2, 6, 5, 7), (6, 3, 3, 2), {"strides": [3, 2]}, False),  # tiled, odd kernel rows
    ((1, 4, 5, 5), (4, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, True),
    ((1, 4, 6, 6), (4, 2, 4, 4), {"strides": [2, 2], "group": 2, "dilations": [1, 2]}, True),
    ((1, 3, 9), (3, 4, 4), {"strides": [2], "auto_pad": "SAME_UPPER"}, True),  # 1-D
])
def test_prepacked_conv_transpose_matches_onnxruntime(path, xs, ws, attrs, bias):
    import onnxruntime as ort

    model = _model(xs, ws, attrs, bias)
    x = RNG.standard_normal(xs).astype(np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, os.path.join(d, "m.onnx"))
        with RuntimeSession(os.path.join(d, "m.onnx")) as s:
            assert any(c.startswith("prepacked:convT-w-p16") for c in s.resolved.kernel_choices)
            for _ in range(2):  # first (cold) run, then the prepared one
                (y,) = s.run({"x": x})
                assert y.shape == expected.shape and y.dtype == np.float32
                np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_tiled_pair_interleave_equals_the_transpose(dtype):
    cols = RNG.standard_normal((2, 3, 3 * 2, 4, 5)).astype(dtype)
    y = ct._tile(cols, 2, 3, (3, 2), (4, 5), (12, 10))
    ref = cols.reshape(2, 3, 3, 2, 4, 5).transpose(0, 1, 4, 2, 5, 3).reshape(2, 3, 12, 10)
    np.testing.assert_array_equal(y, ref)
    assert y.flags.c_contiguous


def test_packed_tiled_call_follows_shape_layout_bias_and_extension_changes(monkeypatch):
    """PackedConvTranspose's inline check of the last tiled call (shape, dtype, layout, bias shape): new
    shapes, a strided view, no bias and no extension each give what the plain kernel gives."""
    from onnx_prepared.kernels import native

    w = RNG.standard_normal((16, 4, 2, 2)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    kw = {"auto_pad": "NOTSET", "dilations": None, "kernel_shape": None, "output_padding": None,
          "output_shape": None, "pads": None, "strides": [2, 2]}
    call = ct.PackedConvTranspose(kshape=(2, 2), mg=4, group=1, **kw)
    packed = ct.pack_transposed(w, group=1)
    base = RNG.standard_normal((2, 16, 6, 10)).astype(np.float32)
    cases = [(base, b), (base, b), (base[:1], b), (base, None), (base[..., ::2], b), (base, b), (base, b)]
    for i, (x, bias) in enumerate(cases):
        np.testing.assert_allclose(call(packed, x, bias)[0], ct.conv_transpose(x, w, bias, strides=[2, 2])[0],
                                   rtol=1e-5, atol=1e-5, err_msg=str(i))
    monkeypatch.setattr(native, "_ext", None)
    for i, (x, bias) in enumerate(cases[:3]):
        np.testing.assert_allclose(call(packed, x, bias)[0], ct.conv_transpose(x, w, bias, strides=[2, 2])[0],
                                   rtol=1e-5, atol=1e-5, err_msg=f"numpy {i}")
