"""Prepacked Conv on a batch of small planes (PackedConv's merged plan, conv_prepacked._merged): the
images' columns side by side in one packed SGEMM, the output C-contiguous. Against conv_core (bit for bit
at every level), and onnxruntime through models at every dispatch level and on the numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.kernels import conv_prepacked as cp
from onnx_prepared.kernels import native
from tests.helpers.dispatch import PATHS, use_path
from tests.kernels.test_sgemm_packed import _check_model, _conv_model

RNG = np.random.default_rng(31)

CASES = [  # (x shape, W shape, attrs): every one has N > 1 and fewer than 256 output positions
    ((2, 8, 8, 8), (16, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # dynamic_minus_one's second conv
    ((3, 6, 5, 7), (10, 3, 3, 3), {"group": 2, "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    ((2, 12, 4, 4), (20, 12, 1, 1), {}),  # pointwise: the columns are the planes side by side
    ((3, 8, 3, 5), (6, 4, 1, 1), {"group": 2}),  # grouped pointwise
    ((2, 5, 6, 6), (4, 5, 1, 1), {"strides": [2, 2]}),  # strided 1x1: im2col
]


@pytest.fixture(autouse=True)
def merge_every_batch(monkeypatch):
    """These weights are below the merge threshold (per-image columns cost less): merged all the same."""
    monkeypatch.setattr(cp, "_MERGE_MIN_WEIGHTS", 0)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _spec(ws, attrs):
    class Node:
        domain, op_type = "", "Conv"

    return cp.conv_rule(Node, dict(attrs), frozenset({1, 2}), {1: (ws, "float32"), 2: ((ws[0],), "float32")})


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize(("xs", "ws", "attrs"), CASES)
@pytest.mark.parametrize("epilogue", [{}, {"lo": 0.0}, {"lo": -1.0, "hi": 6.0, "act": 1}])
def test_merged_plan_equals_conv_core_and_is_c_contiguous(xs, ws, attrs, epilogue):
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    spec = _spec(ws, attrs)
    packed, k = spec.pack(w), spec.kernel
    for level in native.supported_levels():
        with native.forced_level(level):
            for _ in range(2):  # the plan is made, then used
                (y,) = k(packed, x, b, **epilogue)
                (ref,) = cp.conv_packed(packed, x, b, kshape=k.kshape, group=k.group, panel_rows=k.panel_rows,
                                        **epilogue, **k.attrs)
                assert y.flags.c_contiguous and ref.flags.c_contiguous
                np.testing.assert_array_equal(y, ref)
    assert k.native_plans()  # the merged plan ran, not conv_core


@pytest.mark.parametrize(("xs", "ws", "attrs"), CASES)
def test_merged_batch_convs_match_onnxruntime(path, xs, ws, attrs):
    _check_model(_conv_model(xs, ws, attrs, bias=True), xs)


def test_a_non_contiguous_input_is_copied(path):
    xs, ws, attrs = CASES[0]
    spec = _spec(ws, attrs)
    w = RNG.standard_normal(ws).astype(np.float32)
    packed, k = spec.pack(w), spec.kernel
    big = RNG.standard_normal((xs[0], xs[1], xs[2], 2 * xs[3])).astype(np.float32)
    x = big[..., ::2]
    (y,) = k(packed, x, None)
    (ref,) = k(packed, np.ascontiguousarray(x), None)
    np.testing.assert_array_equal(y, ref)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
def test_small_weights_take_the_per_image_columns(monkeypatch):
    """Below _MERGE_MIN_WEIGHTS a batch of small planes runs per image (the SGEMM's batch), above merged:
    the same values."""
    xs, ws, attrs = CASES[0]
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    spec = _spec(ws, attrs)
    packed = spec.pack(w)
    outs, names = [], []
    for threshold in (cp._MERGE_MIN_WEIGHTS, 1 << 19):
        monkeypatch.setattr(cp, "_MERGE_MIN_WEIGHTS", threshold)
        k = _spec(ws, attrs).kernel
        outs.append(k(packed, x, None)[0])
        names.append(k._plain._plans[xs][1].__name__)
    # per image: the column matrix, or at AVX-512 the implicit tile (rows of _IMPLICIT_MIN_WIDTH or more)
    assert names[0] == "merged" and names[1] in ("im2col", "implicit")
    np.testing.assert_array_equal(outs[0], outs[1])
