"""ConvTranspose against onnxruntime: ranks, groups, strides, dilations, pads, output_padding,
output_shape and every auto_pad."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.kernels.onnx_node_check import check, check_ort

RNG = np.random.default_rng(4)
SHAPES = [((1, 4, 5, 6), (4, 3, 3, 3), 1), ((2, 4, 5), (4, 2, 4), 2), ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), 1),
          ((1, 6, 4, 4), (6, 1, 3, 3), 6)]


def _grid():
    for (xs, ws, g), s, d, op, ap, pads, osh in itertools.product(
        SHAPES, [1, 2, 3], [1, 2], [0, 1], ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"], [False, True],
        [False, True],
    ):
        if op and (op >= s or d >= s):
            continue
        if (ap != "NOTSET" and (pads or osh)) or (pads and osh):
            continue
        nd = len(xs) - 2
        attrs = {"group": g, "strides": [s] * nd, "dilations": [d] * nd, "auto_pad": ap}
        if op:
            attrs["output_padding"] = [op] * nd
        if pads:
            attrs["pads"] = [1] * nd + [0] * nd
        if osh:
            attrs["output_shape"] = [n * s + 1 for n in xs[2:]]
        yield pytest.param(xs, ws, attrs, id=f"{nd}d-g{g}-" + "-".join(f"{k}{v}" for k, v in attrs.items()))


@pytest.mark.parametrize(("xs", "ws", "attrs"), list(_grid()))
def test_conv_transpose_against_onnxruntime(xs, ws, attrs):
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[1] * attrs["group"]).astype(np.float32)
    check_ort("ConvTranspose", [x, w, b], opset=17, **attrs)


def test_conv_transpose_segmentation_head_shape():
    x = RNG.standard_normal((1, 64, 28, 28)).astype(np.float32)
    w = (RNG.standard_normal((64, 21, 4, 4)) * 0.1).astype(np.float32)
    (y,) = check_ort("ConvTranspose", [x, w], opset=11, strides=[2, 2], pads=[1, 1, 1, 1])
    assert y.shape == (1, 21, 56, 56)


def test_conv_transpose_float64_against_reference():
    x, w = RNG.standard_normal((1, 2, 4, 4)), RNG.standard_normal((2, 3, 3, 3))
    (y,) = check("ConvTranspose", [x, w], opset=11, rtol=1e-10, atol=1e-10, strides=[2, 2], output_padding=[1, 1])
    assert y.dtype == np.float64


@pytest.mark.parametrize(("xs", "ws", "strides", "group"), [
    ((1, 16, 8, 8), (16, 16, 2, 2), [2, 2], 1),  # UNet's upsampling
    ((2, 4, 3, 5), (4, 3, 3, 2), [3, 2], 2),
    ((1, 3, 7), (3, 2, 4), [4], 1),
])
def test_conv_transpose_stride_equal_to_kernel_is_one_transpose(xs, ws, strides, group):
    """The taps tile the output without overlap: the transpose path against onnxruntime, bias included."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[1] * group).astype(np.float32)
    check_ort("ConvTranspose", [x, w, b], opset=17, strides=strides, group=group)
    check_ort("ConvTranspose", [x, w], opset=17, strides=strides, group=group)
