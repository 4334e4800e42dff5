"""Bilinear Resize of the last two axes (``_resize_linear.Linear2D``, the extension's ``resize_linear2d``):
onnxruntime's bits on every coordinate_transformation_mode it runs for linear, the same bits at every
dispatch level and in numpy, and the cases that keep the separable path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from onnx_prepared.bind import bind_node
from onnx_prepared.bind.kernel import specialize_constants
from onnx_prepared.kernels import native
from onnx_prepared.kernels import resize as rz
from tests.kernels.onnx_node_check import run_ort

RNG = np.random.default_rng(17)
CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
        "tf_half_pixel_for_nn"]
# (input shape, sizes): up, down, mixed, one axis kept, a single output row, lraspp's two, rank 2 and 3
CASES = [((1, 3, 5, 7), (1, 3, 11, 13)), ((2, 2, 9, 9), (2, 2, 4, 5)), ((1, 2, 6, 4), (1, 2, 3, 10)),
         ((1, 3, 5, 7), (1, 3, 5, 14)), ((1, 2, 4, 6), (1, 2, 1, 9)), ((1, 128, 4, 4), (1, 128, 8, 8)),
         ((1, 4, 8, 8), (1, 4, 64, 64)), ((6, 5), (13, 3)), ((3, 4, 4), (3, 7, 2))]


def _bound(sizes: np.ndarray, roi: np.ndarray | None = None, **attrs):
    node = helper.make_node("Resize", ["x0", "x1", "x2", "x3"], ["y"], mode="linear", **attrs)
    k = bind_node(node, {"": 19})
    return specialize_constants(k, {1: roi, 2: None, 3: sizes}, 4).call


def _plan(x: np.ndarray, sizes, roi=None, **attrs) -> rz.Linear2D:
    geo = rz._plan(x, roi, None, np.array(sizes, np.int64), mode="linear", **attrs)
    lin = rz._linear2d(x.shape, x.dtype, *geo)
    assert lin is not None
    return lin


@pytest.mark.parametrize(("ctm", "case"), list(itertools.product(CTMS, CASES)))
def test_bilinear_gives_onnxruntimes_bits(ctm, case):
    shape, out = case
    x = RNG.standard_normal(shape).astype(np.float32)
    sizes = np.array(out, np.int64)
    y = _bound(sizes, coordinate_transformation_mode=ctm)(x, None, None, sizes)[0]
    assert y.shape == out and y.dtype == np.float32
    if len(shape) == 3:  # onnxruntime runs rank 3 as trilinear: the kept axis's weight 1 and 0 terms
        expect = run_ort("Resize", [x, None, None, sizes], opset=19, mode="linear",
                         coordinate_transformation_mode=ctm)[0]
        np.testing.assert_allclose(y, expect, rtol=1e-6, atol=1e-6)
        return
    expect = run_ort("Resize", [x, None, None, sizes], opset=19, mode="linear", coordinate_transformation_mode=ctm)[0]
    np.testing.assert_array_equal(y, expect)


@pytest.mark.parametrize("case", [((1, 2, 5, 7), (1, 2, 4, 6)), ((1, 2, 5, 7), (1, 2, 1, 9)),
                                  ((2, 3, 4, 4), (2, 3, 9, 2))])
def test_tf_crop_and_resize_extrapolates_like_onnxruntime(case):
    shape, out = case
    x = RNG.standard_normal(shape).astype(np.float32)
    sizes = np.array(out, np.int64)
    roi = np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32)
    attrs = {"coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -3.0}
    y = _bound(sizes, roi, **attrs)(x, roi, None, sizes)[0]
    expect = run_ort("Resize", [x, roi, None, sizes], opset=19, mode="linear", **attrs)[0]
    np.testing.assert_array_equal(y, expect)
    assert (y == -3).any()


@pytest.mark.parametrize("ctm", [*CTMS, "tf_crop_and_resize"])
def test_every_level_and_numpy_give_the_same_bits(ctm, monkeypatch):
    x = RNG.standard_normal((3, 5, 6, 9)).astype(np.float32)
    roi = np.array([0, 0, 0.1, -0.1, 1, 1, 1.1, 0.8], np.float32) if ctm == "tf_crop_and_resize" else None
    lin = _plan(x, (3, 5, 13, 4), roi, coordinate_transformation_mode=ctm, extrapolation_value=2.5)
    ref = lin.numpy(x)
    for level in native.supported_levels():
        with native.forced_level(level):
            np.testing.assert_array_equal(lin(x), ref, err_msg=level)
    np.testing.assert_array_equal(lin(np.asfortranarray(x)), ref)  # a strided input takes numpy
    monkeypatch.setattr(native, "_ext", None)
    np.testing.assert_array_equal(lin(x), ref)


def test_large_inputs_split_over_the_pool_give_the_same_bits():
    x = RNG.standard_normal((1, 9, 40, 50)).astype(np.float32)
    lin = _plan(x, (1, 9, 160, 200))  # 2^18 outputs: over the pool's threads
    np.testing.assert_array_equal(lin(x), lin.numpy(x))


def test_the_separable_path_keeps_the_other_cases():
    x = RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)
    geo = rz._plan(x, None, np.array([1, 2, 2, 2], np.float32), None, mode="linear")
    assert rz._linear2d(x.shape, x.dtype, *geo) is None  # an outer axis resized
    geo = rz._plan(x, None, np.array([1, 1, 2, 2], np.float32), None, mode="nearest")
    assert rz._linear2d(x.shape, x.dtype, *geo) is None
    x16 = x.astype(np.float16)
    geo = rz._plan(x16, None, np.array([1, 1, 2, 2], np.float32), None, mode="linear")
    assert rz._linear2d(x16.shape, x16.dtype, *geo) is None
    x1 = x[0, 0, 0]
    geo = rz._plan(x1, None, np.array([2], np.float32), None, mode="linear")
    assert rz._linear2d(x1.shape, x1.dtype, *geo) is None  # rank 1


@pytest.mark.skipif(not native.available(), reason="needs the extension")
def test_the_extension_rejects_bad_tables():
    x = np.zeros((1, 1, 2, 2), np.float32)
    y = np.zeros((1, 1, 3, 3), np.float32)
    itab = np.array([1, 2, 2, 3, 3, 0] + [0, 1, 1] * 2 + [0, 1, 1] * 2 + [0] * 6, np.int64)
    ftab = np.zeros(13, np.float32)
    native._ext.resize_linear2d(x, y, itab, ftab)
    bad = itab.copy()
    bad[6] = 2  # row 2 of a 2-row input
    with pytest.raises(ValueError, match="outside the input"):
        native._ext.resize_linear2d(x, y, bad, ftab)
    with pytest.raises(ValueError, match="ftab"):
        native._ext.resize_linear2d(x, y, itab, ftab[:-1])
    with pytest.raises(ValueError, match="itab"):
        native._ext.resize_linear2d(x, y, itab[:-1], ftab)
    with pytest.raises(ValueError, match="smaller"):
        native._ext.resize_linear2d(x, y[0, 0, :2].copy(), itab, ftab)
