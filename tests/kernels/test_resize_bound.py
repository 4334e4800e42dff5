"""Resize's nearest repeat path (whole-factor upsampling as one broadcast copy) and its bound call for
constant roi/scales/sizes (``registry.specializes``): against onnxruntime and the per-axis gathers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from onnx_prepared.bind import bind_node
from onnx_prepared.bind.kernel import specialize_constants
from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import resize as rz
from tests.kernels.onnx_node_check import run_ort

RNG = np.random.default_rng(13)
CTMS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "tf_half_pixel_for_nn", "align_corners"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _gathers(x, scales, **attrs):
    """The per-axis gather path (the repeat path switched off)."""
    saved = rz._nearest_repeat
    rz._nearest_repeat = lambda *a: None
    try:
        return rz.resize(x, None, scales, None, **attrs)[0]
    finally:
        rz._nearest_repeat = saved


@pytest.mark.parametrize(("ctm", "nearest_mode"), list(itertools.product(CTMS, NEAREST)))
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 3, 1], [1, 1, 1, 2], [1, 1, 2, 3], [2, 1, 2, 2]])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16])
def test_nearest_repeat_matches_the_gathers_and_onnxruntime(ctm, nearest_mode, scales, dtype):
    x = (RNG.standard_normal((1, 3, 5, 4)) * 50).astype(dtype)
    sc = np.array(scales, np.float32)
    attrs = {"coordinate_transformation_mode": ctm, "mode": "nearest", "nearest_mode": nearest_mode}
    (y,) = rz.resize(x, None, sc, None, **attrs)
    assert y.dtype == x.dtype and y.flags.c_contiguous
    np.testing.assert_array_equal(y, _gathers(x, sc, **attrs))
    if dtype in (np.float32, np.uint8):  # onnxruntime has no int64 or float16 Resize on the CPU
        np.testing.assert_array_equal(y, run_ort("Resize", [x, None, sc], opset=19, **attrs)[0])


def test_nearest_repeat_is_taken_only_for_repeating_indices():
    assert rz._repeat_factor(5, 10, 2.0, 10.0, "asymmetric", "floor") == 2
    assert rz._repeat_factor(5, 10, 2.0, 10.0, "tf_half_pixel_for_nn", "round_prefer_floor") == 0  # 0 1 1 2 2 ...
    assert rz._repeat_factor(4, 6, 1.5, 6.0, "asymmetric", "floor") == 0


def _bound(n_inputs: int, consts: dict, **attrs):
    node = helper.make_node("Resize", [f"x{i}" for i in range(n_inputs)], ["y"], **attrs)
    k = bind_node(node, {"": 19})
    return k.call, specialize_constants(k, consts, n_inputs).call


@pytest.mark.parametrize(("mode", "spec"), [("nearest", ("scales", [1, 1, 2, 2])), ("linear", ("sizes", [1, 3, 9, 4])),
                                            ("cubic", ("scales", [1, 1, 0.6, 1.5]))])
def test_bound_resize_matches_the_kernel_and_onnxruntime(mode, spec):
    kind, vals = spec
    scales = np.array(vals, np.float32) if kind == "scales" else None
    sizes = np.array(vals, np.int64) if kind == "sizes" else None
    inputs = [None, scales] + ([sizes] if sizes is not None else [])
    plain, bound = _bound(len(inputs) + 1, dict(enumerate(inputs, 1)), mode=mode)
    assert bound is not plain
    for shape in [(1, 3, 5, 7), (1, 3, 4, 4)]:  # a plan per input shape
        x = RNG.standard_normal(shape).astype(np.float32)
        y = bound(x, *inputs)[0]
        np.testing.assert_array_equal(y, plain(x, *inputs)[0])
        np.testing.assert_allclose(y, run_ort("Resize", [x, *inputs], opset=19, mode=mode)[0], rtol=1e-5, atol=1e-5)


def test_bound_resize_reads_runtime_inputs_per_call_and_reports_bad_ones():
    plain, bound = _bound(3, {1: None}, mode="nearest")  # runtime scales: planned per value
    assert bound is not plain
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    for vals in ([1, 1, 2, 2], [1, 1, 3, 1], [1, 1, 2, 2], [1, 1, 0.5, 1.5]):
        sc = np.array(vals, np.float32)
        np.testing.assert_array_equal(bound(x, None, sc)[0], plain(x, None, sc)[0])
    with pytest.raises(KernelError, match="scales"):
        bound(x, None, np.array([1, 2], np.float32))
    _, bound = _bound(3, {1: None, 2: np.array([1, 2], np.float32)}, mode="nearest")
    with pytest.raises(KernelError, match="scales"):
        bound(np.zeros((1, 1, 2, 2), np.float32), None, None)


def test_bound_nearest_repeat_follows_layout_dtype_and_extension_changes(monkeypatch):
    """The bound call's settled ``nearest_repeat2d`` (last shape, dtype and scales checked inline): a strided
    view, other dtypes, changed runtime scales and no extension each give what the plain kernel gives."""
    from onnx_prepared.kernels import native

    plain, bound = _bound(3, {1: None}, mode="nearest")
    base = RNG.standard_normal((2, 3, 4, 10)).astype(np.float32)
    s2, s3 = np.array([1, 1, 2, 2], np.float32), np.array([1, 1, 3, 1], np.float32)
    cases = [(base, s2), (base, s2), (base[..., ::2], s2), (base.astype(np.float64), s2), (base, s3),
             ((base * 10).astype(np.int32), s2), (base[:1], s2), (base, s2)]
    for i, (x, sc) in enumerate(cases):
        np.testing.assert_array_equal(bound(x, None, sc)[0], plain(x, None, sc)[0], err_msg=str(i))
    monkeypatch.setattr(native, "_ext", None)
    for i, (x, sc) in enumerate(cases[:3]):
        np.testing.assert_array_equal(bound(x, None, sc)[0], plain(x, None, sc)[0], err_msg=str(i))
