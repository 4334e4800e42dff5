"""Pad, TopK, NonMaxSuppression and Einsum against onnxruntime (integer outputs exactly)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.kernels.onnx_node_check import check, check_ort

RNG = np.random.default_rng(6)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 1, 2, 1, 0, 2], [1, 0, -1, 0, 2, 1], [0, 0, 0, 0, 0, 0]])
def test_pad_modes(mode, pads):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    check_ort("Pad", [x, np.array(pads, np.int64), np.array(1.5, np.float32)], opset=19, mode=mode)


def test_pad_axes_and_attribute_form():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    check_ort("Pad", [x, np.array([1, 2, 0, 3], np.int64), None, np.array([2, -3], np.int64)], opset=18)
    check_ort("Pad", [x], opset=2, pads=[0, 1, 1, 0, 2, 0], mode="constant", value=-2.0)
    check_ort("Pad", [x], opset=2, pads=[0, 1, 1, 0, 2, 0], mode="reflect")


def test_pad_integers():
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    check_ort("Pad", [x, np.array([1, 1, 2, 0], np.int64), np.array(7, np.int64)], opset=13)


def _topk_types(x):
    return [onnx.helper.np_dtype_to_tensor_dtype(x.dtype), TensorProto.INT64]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_topk_ties_and_types(dtype, largest, axis):
    x = RNG.integers(0, 6, (5, 7, 9)).astype(dtype)  # many ties
    check_ort("TopK", [x, np.array([3], np.int64)], opset=11, n_outputs=2, out_elem=_topk_types(x),
              largest=largest, axis=axis)


def test_topk_nan_and_opset_1():
    x = np.array([[1, np.nan, 3, np.nan, 2, 5]], np.float32)
    for largest in (0, 1):
        check_ort("TopK", [x, np.array([4], np.int64)], opset=11, n_outputs=2, out_elem=_topk_types(x),
                  largest=largest)
    check("TopK", [RNG.standard_normal((3, 8)).astype(np.float32)], opset=1, n_outputs=2, k=3)


@pytest.mark.parametrize("shape", [(2, 8400), (1, 8400), (8400,)])
@pytest.mark.parametrize("largest", [0, 1])
def test_topk_large_input(shape, largest):
    """(1, 8400) and (8400,) take the partition path; ties at the k-th value keep the lower indices."""
    x = np.round(RNG.standard_normal(shape) * 3).astype(np.float32)
    check_ort("TopK", [x, np.array([300], np.int64)], opset=11, n_outputs=2, out_elem=_topk_types(x),
              largest=largest)


@pytest.mark.parametrize("trial", range(16))
def test_non_max_suppression(trial):
    b, c, n = 2, 3, 40
    xy, wh = RNG.uniform(0, 10, (b, n, 2)), RNG.uniform(0.5, 4, (b, n, 2))
    cpb = trial % 2
    if cpb:
        boxes = np.concatenate([xy, wh], -1)
    elif trial % 4 == 0:
        boxes = np.concatenate([xy, xy + wh], -1)
    else:
        boxes = np.concatenate([xy + wh, xy], -1)  # flipped corners
    scores = np.round(RNG.uniform(0, 1, (b, c, n)), 1)  # ties
    inputs = [boxes.astype(np.float32), scores.astype(np.float32), np.array([trial % 7], np.int64),
              np.array([0.1 + 0.1 * (trial % 5)], np.float32)]
    if trial % 3:
        inputs.append(np.array([0.3], np.float32))
    check_ort("NonMaxSuppression", inputs, opset=11, out_elem=TensorProto.INT64, center_point_box=cpb)


def test_non_max_suppression_defaults_select_nothing():
    boxes, scores = np.zeros((1, 2, 4), np.float32), np.ones((1, 1, 2), np.float32)
    check_ort("NonMaxSuppression", [boxes, scores], opset=11, out_elem=TensorProto.INT64)


@pytest.mark.parametrize(
    ("eq", "shapes"),
    [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)]), ("i,i", [(5,), (5,)]),
     ("...ii->...i", [(2, 3, 3)]), ("bhqd,bhkd->bhqk", [(1, 2, 5, 8), (1, 2, 6, 8)]),
     ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("ij->", [(3, 4)]), ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)])],
)
def test_einsum(eq, shapes):
    check_ort("Einsum", [RNG.standard_normal(s).astype(np.float32) for s in shapes], opset=12, equation=eq)


@pytest.mark.parametrize("trial", range(6))
def test_non_max_suppression_native_equals_the_numpy_path(trial, monkeypatch):
    """Many overlapping boxes, ties, zero-area boxes and thresholds on exact IoU values: same selection."""
    from onnx_prepared.kernels import native
    from tests.kernels.onnx_node_check import run_ours

    b, c, n = 2, 2, 300
    xy = np.round(RNG.uniform(0, 20, (b, n, 2)), 0)
    wh = np.round(RNG.uniform(0, 6, (b, n, 2)), 0)  # integers: IoUs hit thresholds exactly; some zero area
    boxes = np.concatenate([xy, xy + wh], -1).astype(np.float32)
    scores = np.round(RNG.uniform(0, 1, (b, c, n)), 1).astype(np.float32)
    inputs = [boxes, scores, np.array([50 + trial * 40], np.int64), np.array([0.25 + 0.05 * trial], np.float32),
              np.array([0.2], np.float32)]
    (fast,) = run_ours("NonMaxSuppression", inputs, opset=11)
    check_ort("NonMaxSuppression", inputs, opset=11, out_elem=TensorProto.INT64)
    monkeypatch.setattr(native, "available", lambda: False)
    (slow,) = run_ours("NonMaxSuppression", inputs, opset=11)
    np.testing.assert_array_equal(fast, slow)
    assert len(fast) > 20


@pytest.mark.parametrize("max_out", [1, 7, 30])
def test_non_max_suppression_sorted_prefix_path(max_out, monkeypatch):
    """Few boxes wanted from many candidates: only the head of the score order (with its ties) is sorted."""
    from onnx_prepared.kernels import native
    from tests.kernels.onnx_node_check import run_ours

    n = 1500
    xy = np.round(RNG.uniform(0, 60, (1, n, 2)), 0)
    boxes = np.concatenate([xy, xy + np.round(RNG.uniform(1, 8, (1, n, 2)), 0)], -1).astype(np.float32)
    scores = np.round(RNG.uniform(0, 1, (1, 3, n)), 2).astype(np.float32)  # many ties at the cut
    inputs = [boxes, scores, np.array([max_out], np.int64), np.array([0.3], np.float32)]
    (fast,) = check_ort("NonMaxSuppression", inputs, opset=11, out_elem=TensorProto.INT64)
    monkeypatch.setattr(native, "available", lambda: False)
    (slow,) = run_ours("NonMaxSuppression", inputs, opset=11)
    np.testing.assert_array_equal(fast, slow)
