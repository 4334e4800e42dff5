"""Resize / Upsample against onnxruntime: nearest (every nearest_mode), linear, cubic (cubic_coeff_a,
exclude_outside), every coordinate_transformation_mode, scales or sizes, axes, keep_aspect_ratio_policy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.kernels.onnx_node_check import check, check_ort

RNG = np.random.default_rng(5)
X = RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)
CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
        "tf_half_pixel_for_nn"]
SPECS = [("scales", [1, 1, 2, 2]), ("scales", [1, 1, 0.6, 1.5]), ("scales", [1, 1, 3, 0.5]),
         ("sizes", [1, 2, 9, 4]), ("sizes", [1, 2, 3, 13])]
# The nearest tie below rounds differently in onnxruntime: its asymmetric coordinate 2 / (4/7) comes out
# as 3.5 there, 3.4999998 in float32 division (its linear path matches float32 division bit for bit).
DIVERGENT = {("nearest", "asymmetric", "round_prefer_ceil", 3)}


def _grid():
    for mode, ctm, nm, (j, spec), ex in itertools.product(
        ["nearest", "linear", "cubic"], CTMS, ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
        enumerate(SPECS), [0, 1],
    ):
        if (mode != "nearest" and nm != "round_prefer_floor") or (mode != "cubic" and ex):
            continue
        if ctm == "align_corners" and spec[0] == "scales" and j > 0:
            continue  # see test_resize_align_corners_with_fractional_scales_follows_the_reference
        if (mode, ctm, nm, j) in DIVERGENT:
            continue
        yield pytest.param(mode, ctm, nm, spec, ex, id=f"{mode}-{ctm}-{nm}-{spec[0]}{j}-ex{ex}")


@pytest.mark.parametrize(("mode", "ctm", "nearest_mode", "spec", "exclude"), list(_grid()))
def test_resize_against_onnxruntime(mode, ctm, nearest_mode, spec, exclude):
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "nearest_mode": nearest_mode}
    if exclude:
        attrs.update(exclude_outside=1, cubic_coeff_a=-0.5)
    kind, vals = spec
    inputs = [X, None, np.array(vals, np.float32) if kind == "scales" else None]
    if kind == "sizes":
        inputs.append(np.array(vals, np.int64))
    check_ort("Resize", inputs, opset=19, **attrs)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_tf_crop_and_resize(mode):
    roi = np.array([0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2], np.float32)
    check_ort("Resize", [X, roi, None, np.array([1, 2, 4, 6], np.int64)], opset=13, mode=mode,
              coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2]])
def test_resize_axes_and_aspect_policy(policy, axes):
    sizes = np.array([8, 9], np.int64)
    check_ort("Resize", [X, None, None, sizes], opset=19, mode="linear", axes=axes, keep_aspect_ratio_policy=policy)


def test_resize_negative_axis():
    check_ort("Resize", [X, None, np.array([2.5], np.float32)], opset=19, mode="cubic", axes=[-1])


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_align_corners_with_fractional_scales_follows_the_reference(mode):
    """NOTE: onnxruntime divides align_corners coordinates by the rounded output size, onnx's reference
    (and its node tests, e.g. test_resize_downsample_scales_linear_align_corners) by in*scale: they
    differ when in*scale is fractional. We keep the reference's (the spec's) reading."""
    check("Resize", [X, None, np.array([1, 1, 0.6, 1.5], np.float32)], opset=19, mode=mode,
          coordinate_transformation_mode="align_corners", rtol=1e-4, atol=1e-5)


def test_resize_x2_nearest_and_linear_on_a_feature_map():
    x = RNG.standard_normal((1, 16, 20, 20)).astype(np.float32)
    for mode in ("nearest", "linear"):
        (y,) = check_ort("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], opset=13, mode=mode)
        assert y.shape == (1, 16, 40, 40)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_resize_nearest_integers(dtype):
    x = RNG.integers(0, 200, (1, 1, 4, 5)).astype(dtype)
    check_ort("Resize", [x, None, np.array([1, 1, 1.5, 2], np.float32)], opset=13, mode="nearest")


def test_resize_float16_linear():
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float16)
    check_ort("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], opset=13, mode="linear", rtol=1e-2,
              atol=1e-2)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_and_resize_10(mode):
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    scales = np.array([1, 1, 2, 1.5], np.float32)
    check_ort("Resize", [x, scales], opset=10, mode=mode)
    check_ort("Upsample", [x, scales], opset=9, mode=mode)
    check_ort("Upsample", [x], opset=7, mode=mode, scales=[1.0, 1.0, 2.0, 1.5])


def test_resize_antialias_uses_the_reference_filter():
    x = RNG.standard_normal((1, 1, 8, 8)).astype(np.float32)
    check("Resize", [x, None, np.array([1, 1, 0.5, 0.5], np.float32)], opset=18, mode="linear", antialias=1,
          rtol=1e-5, atol=1e-6)
