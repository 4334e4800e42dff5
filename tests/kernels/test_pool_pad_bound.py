"""The bound calls of Pad, Max/AveragePool and the Global pools (``registry.specializes``): what a
session runs. Each is checked against onnxruntime and against the plain kernel, with the extension, at
every dispatch level, and on the numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_prepared.bind import bind_node
from onnx_prepared.bind.kernel import specialize_constants
from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from tests.kernels.onnx_node_check import run_ort

RNG = np.random.default_rng(13)


def _bound(op: str, n_inputs: int, consts: dict | None = None, *, opset: int, **attrs):
    node = helper.make_node(op, [f"x{i}" for i in range(n_inputs)], ["y"], **attrs)
    k = bind_node(node, {"": opset})
    assert not k.is_fallback
    special = specialize_constants(k, consts or {}, n_inputs)
    return k.call, special.call


def test_zero_pad_returns_its_input_at_opsets_2_and_11():
    x = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    plain, bound = _bound("Pad", 1, opset=9, pads=[0] * 8, mode="constant")
    assert bound is not plain and bound(x)[0] is x
    np.testing.assert_array_equal(plain(x)[0], x)
    pads = np.zeros(8, np.int64)
    plain, bound = _bound("Pad", 2, {1: pads}, opset=13, mode="reflect")
    assert bound(x, pads)[0] is x
    np.testing.assert_array_equal(run_ort("Pad", [x, pads], opset=13, mode="reflect")[0], x)


def test_zero_pad_of_the_wrong_rank_still_raises():
    _, bound = _bound("Pad", 1, opset=9, pads=[0] * 6)
    with pytest.raises(KernelError, match="pads"):
        bound(np.zeros((1, 2, 3, 4), np.float32))


def test_nonzero_or_runtime_pads_and_axes_keep_the_kernel():
    plain, bound = _bound("Pad", 1, opset=9, pads=[0, 0, 1, 0, 0, 0, 0, 1])
    assert bound is plain
    plain, bound = _bound("Pad", 2, {}, opset=13)
    assert bound is plain
    plain, bound = _bound("Pad", 4, {1: np.zeros(4, np.int64), 3: None}, opset=18)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    assert bound(x, np.zeros(4, np.int64), None, None)[0] is x
    plain, bound = _bound("Pad", 4, {1: np.zeros(2, np.int64)}, opset=18)  # runtime axes
    assert bound is plain


POOLS = [
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER")),
]


@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("op", "attrs"), POOLS)
def test_bound_pools_match_onnxruntime_and_the_kernel(op, attrs, level, monkeypatch):
    plain, bound = _bound(op, 1, opset=19, **attrs)
    for shape in [(1, 8, 16, 16), (2, 3, 11, 13)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        with native.forced_level(level):
            got = bound(x)[0]
            again = bound(x)[0]  # the planned call
        np.testing.assert_array_equal(got, again)
        np.testing.assert_array_equal(got, plain(x)[0])
        np.testing.assert_allclose(got, run_ort(op, [x], opset=19, **attrs)[0], rtol=1e-6, atol=1e-6)
        with monkeypatch.context() as m:
            m.setattr(native, "_ext", None)  # the numpy fallback, through the same bound call
            np.testing.assert_allclose(bound(x)[0], got, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(bound(x.astype(np.float64))[0], got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_bound_pools_of_other_ranks_take_the_kernel(op):
    plain, bound = _bound(op, 1, opset=19, kernel_shape=[3], strides=[2])
    x = RNG.standard_normal((2, 3, 12)).astype(np.float32)
    np.testing.assert_array_equal(bound(x)[0], plain(x)[0])
    np.testing.assert_allclose(bound(x)[0], run_ort(op, [x], opset=19, kernel_shape=[3], strides=[2])[0],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 16, 8, 8), (2, 2, 3, 4, 5)])
def test_bound_global_pools(op, shape, monkeypatch):
    plain, bound = _bound(op, 1, opset=12)
    x = RNG.standard_normal(shape).astype(np.float32)
    got = bound(x)[0]
    assert got.shape == shape[:2] + (1,) * (len(shape) - 2)
    np.testing.assert_allclose(got, run_ort(op, [x], opset=12)[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, plain(x)[0], rtol=1e-6, atol=1e-7)
    x[0, 1].flat[2] = np.nan  # NaN propagates as in the kernel (onnxruntime's GlobalMaxPool skips it)
    got = bound(x)[0]
    assert np.isnan(got[0, 1]).all()
    np.testing.assert_allclose(got, plain(x)[0], rtol=1e-6, atol=1e-7)
    view = np.swapaxes(x, -1, -2)  # not contiguous
    np.testing.assert_allclose(bound(view)[0], plain(view)[0], rtol=1e-6, atol=1e-7)
    monkeypatch.setattr(native, "_ext", None)
    np.testing.assert_allclose(bound(x)[0], got, rtol=1e-6, atol=1e-7)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(bound(h)[0], plain(h)[0])
