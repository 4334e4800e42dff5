"""Pool kernels against onnxruntime: every rank, pads, auto_pad, strides, dilations, ceil_mode,
count_include_pad, MaxPool's Indices (both storage orders), LpPool and the Global pools."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto

from tests.kernels.onnx_node_check import check, check_ort, run_ours

RNG = np.random.default_rng(1)
SHAPES = [((2, 3, 9), (3,)), ((1, 2, 7, 8), (3, 2)), ((1, 2, 5, 6, 7), (2, 3, 2))]


def _grid():
    for (xs, k), ceil, s, d, pads, auto_pad in itertools.product(
        SHAPES, [0, 1], [1, 2], [1, 2], [False, True], ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]
    ):
        if auto_pad != "NOTSET" and (pads or ceil):
            continue
        nd = len(k)
        attrs = {"kernel_shape": list(k), "strides": [s] * nd, "auto_pad": auto_pad}
        if d > 1:
            attrs["dilations"] = [d] * nd
        if ceil:
            attrs["ceil_mode"] = 1
        if pads:
            attrs["pads"] = [1] * nd + [min(kk - 1, 2) for kk in k]
        yield pytest.param(xs, attrs, id=f"{len(xs) - 2}d-" + "-".join(f"{a}{v}" for a, v in attrs.items()))


GRID = list(_grid())


@pytest.mark.parametrize(("xs", "attrs"), GRID)
def test_max_pool_with_indices(xs, attrs):
    x = RNG.standard_normal(xs).astype(np.float32)
    check_ort("MaxPool", [x], opset=12, n_outputs=2, out_elem=[TensorProto.FLOAT, TensorProto.INT64], **attrs)


@pytest.mark.parametrize(("xs", "attrs"), GRID)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(xs, attrs, count_include_pad):
    x = RNG.standard_normal(xs).astype(np.float32)
    check_ort("AveragePool", [x], opset=19, count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize(("xs", "attrs"), GRID[::3])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(xs, attrs, p):
    x = RNG.standard_normal(xs).astype(np.float32)
    check_ort("LpPool", [x], opset=18, p=p, **attrs)


def test_max_pool_column_major_indices_and_ties():
    x = np.round(RNG.standard_normal((2, 3, 6, 5)) * 2).astype(np.float32)  # many ties
    check_ort("MaxPool", [x], opset=12, n_outputs=2, out_elem=[TensorProto.FLOAT, TensorProto.INT64],
              kernel_shape=[3, 2], pads=[1, 1, 1, 0], storage_order=1)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16])
def test_max_pool_dtypes(dtype):
    x = RNG.integers(0, 100, (1, 2, 7, 7)).astype(dtype)
    (y,) = check_ort("MaxPool", [x], opset=12, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    assert y.dtype == dtype


def test_max_pool_single_output_at_opset_1():
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    check("MaxPool", [x], opset=1, kernel_shape=[2, 2], strides=[2, 2])


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 5, 6), (2, 2, 3, 4, 5)])
def test_global_pools_every_rank(op, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    (y,) = check_ort(op, [x], opset=12)
    assert y.shape == shape[:2] + (1,) * (len(shape) - 2)  # onnx.reference's GlobalMaxPool gets 3-D wrong


def test_global_average_pool_float16_accumulates_in_float32():
    x = (RNG.standard_normal((1, 2, 64, 64)) * 100).astype(np.float16)
    (y,) = run_ours("GlobalAveragePool", [x], opset=12)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                               rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 16, 16, 16), (1, 9, 2, 2), (2, 2, 3, 4, 5)])
def test_global_average_pool_native_and_numpy_paths_agree(shape, monkeypatch):
    from onnx_prepared.kernels import native

    x = RNG.standard_normal(shape).astype(np.float32)
    (fast,) = check_ort("GlobalAveragePool", [x], opset=12)
    monkeypatch.setattr(native, "_ext", None)
    (slow,) = check_ort("GlobalAveragePool", [x], opset=12)
    np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-7)


GRID_2D = [p for p in GRID if len(p.values[0]) == 4]


@pytest.mark.parametrize("level", __import__("onnx_prepared.kernels.native", fromlist=["x"]).supported_levels())
@pytest.mark.parametrize(("xs", "attrs"), GRID_2D[::2])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_native_2d_pools_at_every_level(op, xs, attrs, level):
    """winpool.c at every dispatch level against onnxruntime, and against the numpy path (exactly for max)."""
    from onnx_prepared.kernels import native, pool

    x = RNG.standard_normal((2, 3, 11, 13)).astype(np.float32)
    extra = {"count_include_pad": 1} if op == "AveragePool" and "pads" in attrs else {}
    with native.forced_level(level):
        (fast,) = check_ort(op, [x], opset=19 if op == "AveragePool" else 12, **attrs, **extra)
    fn = pool.max_pool if op == "MaxPool" else pool.average_pool
    saved = native._ext
    try:
        native._ext = None
        (slow,) = fn(x, **attrs, **extra)
    finally:
        native._ext = saved
    if op == "MaxPool":
        np.testing.assert_array_equal(fast, slow)
    else:
        np.testing.assert_allclose(fast, slow, rtol=1e-6, atol=1e-6)


def test_native_max_pool_propagates_nan_and_resnet_stem():
    from onnx_prepared.kernels import pool

    x = RNG.standard_normal((1, 64, 32, 32)).astype(np.float32)
    check_ort("MaxPool", [x], opset=12, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    x[0, 3, 5, 7] = np.nan
    (y,) = pool.max_pool(x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    assert np.isnan(y[0, 3]).sum() == 4 and not np.isnan(np.delete(y, 3, axis=1)).any()


TWO_BY_TWO = [((1, 3, 8, 8), {}), ((2, 3, 9, 7), {}), ((1, 2, 9, 7), {"ceil_mode": 1}),
              ((1, 2, 8, 6), {"pads": [0, 0, 1, 1]}), ((1, 2, 5, 300), {}), ((1, 1, 2, 2), {})]


@pytest.mark.parametrize("level", __import__("onnx_prepared.kernels.native", fromlist=["x"]).supported_levels())
@pytest.mark.parametrize(("xs", "extra"), TWO_BY_TWO)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_native_2x2_stride_2_pools_at_every_level(op, xs, extra, level):
    """winpool.inc's direct 2x2 stride-2 planes (odd sizes floor away the last row and column; ceil-mode
    overhang and padding, which leave it, take the general planes; rows wider than its 128-column chunks)
    against onnxruntime and the numpy path (exactly for max), NaN propagating through the max."""
    from onnx_prepared.kernels import native, pool

    x = RNG.standard_normal(xs).astype(np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], **extra}
    with native.forced_level(level):
        (fast,) = check_ort(op, [x], opset=19 if op == "AveragePool" else 12, **attrs)
        fn = pool.max_pool if op == "MaxPool" else pool.average_pool
        x[0, 0, 1, 0] = np.nan
        (fast_nan,) = fn(x, **attrs)
    saved = native._ext
    try:
        native._ext = None
        (slow_nan,) = fn(x, **attrs)
    finally:
        native._ext = saved
    assert np.isnan(fast_nan[0, 0, 0, 0]) and np.isnan(fast_nan).sum() == 1
    np.testing.assert_allclose(fast, np.where(np.isnan(slow_nan), fast, slow_nan), rtol=1e-6, atol=1e-6)
    if op == "MaxPool":
        np.testing.assert_array_equal(fast_nan, slow_nan)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"])
def test_bound_pools_follow_shape_dtype_layout_and_extension_changes(op, monkeypatch):
    """The bound closures' inline check of the last shape's plan: a new shape, a strided view, float64 and
    no extension (the numpy fallback) each give what the plain kernel gives."""
    from onnx_prepared.kernels import native, pool

    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]} if "Global" not in op else {}
    name = {"MaxPool": "max_pool", "AveragePool": "average_pool", "GlobalMaxPool": "global_max_pool",
            "GlobalAveragePool": "global_average_pool"}[op]
    bound = getattr(pool, f"_{name}_bound")({}, 1, **attrs)
    kernel = getattr(pool, name)
    base = RNG.standard_normal((2, 3, 8, 12)).astype(np.float32)
    cases = [base, base, base[:1, :, :6], base, base[..., ::2], base.astype(np.float64), base[1:], base]
    for i, x in enumerate(cases):
        np.testing.assert_allclose(bound(x)[0], kernel(x, **attrs)[0], rtol=1e-6, atol=1e-6, err_msg=str(i))
    monkeypatch.setattr(native, "_ext", None)
    for i, x in enumerate(cases[:3]):
        np.testing.assert_allclose(bound(x)[0], kernel(x, **attrs)[0], rtol=1e-6, atol=1e-6, err_msg=str(i))


@pytest.mark.skipif("avx512vnni" not in __import__("onnx_prepared.kernels.native", fromlist=["x"]).supported_levels(),
                    reason="needs AVX-512")
@pytest.mark.parametrize("seed", range(3))
def test_direct_avx512_max_pool_gives_the_scratch_path_bits(seed):
    """The AVX-512 MaxPool straight from the input (winpool_isa.c: strides 1-2 along rows, no dilation)
    against the scratch-plane path (its AVX2 build) bit for bit on random geometries with NaNs of both
    signs, signed zeros and -inf, ceil mode and pads, wide rows (several 16-lane blocks), more than
    WP_HZ_ROWS rows."""
    from onnx_prepared.kernels import native, pool

    rng = np.random.default_rng(seed)
    done = 0
    while done < 40:
        kh, kw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        h, w = (200, 9) if done == 0 else (int(rng.integers(kh, 40)), int(rng.integers(kw, 50)))
        attrs = {"kernel_shape": [kh, kw], "strides": [int(rng.integers(1, 4)), int(rng.integers(1, 3))],
                 "pads": [int(rng.integers(0, kh)), int(rng.integers(0, kw)), int(rng.integers(0, kh)),
                          int(rng.integers(0, kw))], "ceil_mode": int(rng.integers(0, 2))}
        x = rng.standard_normal((int(rng.integers(1, 3)), int(rng.integers(1, 4)), h, w)).astype(np.float32)
        for v in (np.nan, -np.nan, -0.0, 0.0, -np.inf):
            x.reshape(-1)[rng.integers(0, x.size, 4)] = v
        with native.forced_level("avx512vnni"):
            (fast,) = pool.max_pool(x, **attrs)
        with native.forced_level("avx2"):
            (slow,) = pool.max_pool(x, **attrs)
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
        done += 1
