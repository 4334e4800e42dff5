"""im2col2d's unit-stride "same" rows (one copy of the plane per channel and tap, im2col.c
i2c_rows_unit) and the AVX2 column-vectorised SGEMM task for narrow weights (sgemm_isa.c
sg_ntask_avx2, M <= SG_NCOLS2_MAXM): against numpy, the row task, and onnxruntime through prepacked
Conv models at every dispatch level and on the numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import native
from tests.helpers.dispatch import PATHS, use_path
from tests.kernels.test_sgemm_packed import _check_model, _conv_model

RNG = np.random.default_rng(13)
needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")


def _cols_numpy(x, kshape, pads, strides, dilations):
    begins, ends, out = sp.geometry("Conv", x.shape[2:], kshape, auto_pad="NOTSET", pads=pads, strides=strides,
                                    dilations=dilations)
    xp = sp.pad_input(x, begins, ends, out, kshape, strides, dilations, 0)
    win = sp.windows(xp, out, kshape, strides, dilations)  # [N, C, *out, *k]
    n, c = x.shape[:2]
    return begins, out, win.transpose(0, 1, 4, 5, 2, 3).reshape(n, 1, c * sp.prod(kshape), sp.prod(out))


GEOMETRIES = [  # (C, H, W, kernel, pads, dilations): the output as wide as the input takes the unit path
    (16, 8, 8, (3, 3), [1, 1, 1, 1], [1, 1]),
    (3, 5, 7, (3, 3), [1, 1, 1, 1], [1, 1]),
    (2, 6, 4, (3, 1), [2, 0, 0, 0], [1, 1]),  # rows only: every tap shifts whole rows
    (4, 4, 9, (5, 5), [2, 2, 2, 2], [1, 1]),
    (2, 7, 7, (3, 3), [2, 2, 2, 2], [2, 2]),  # dilated
    (1, 2, 2, (3, 3), [1, 1, 1, 1], [1, 1]),  # smaller than the kernel
    (2, 9, 1, (3, 1), [1, 0, 1, 0], [1, 1]),  # one column: every element is its row's first and last
    (3, 6, 6, (3, 3), [0, 0, 0, 0], [1, 1]),  # narrower output: the row loop
    (2, 3, 3, (7, 7), [3, 3, 3, 3], [1, 1]),  # taps entirely outside the input
]


@needs_ext
@pytest.mark.parametrize(("c", "h", "w", "k", "pads", "dil"), GEOMETRIES)
@pytest.mark.parametrize("merge", [False, True])
def test_im2col_matches_the_window_view(c, h, w, k, pads, dil, merge):
    x = RNG.standard_normal((2, c, h, w)).astype(np.float32)
    begins, out, ref = _cols_numpy(x, k, pads, [1, 1], dil)
    got = native.im2col2d(x, 1, k, out, begins, [1, 1], dil, merge)
    if merge:
        ref = ref.transpose(1, 2, 0, 3).reshape(1, 1, ref.shape[2], -1)
    np.testing.assert_array_equal(got, ref)


@needs_ext
def test_im2col_unit_rows_read_only_their_plane():
    """The plane copy is clipped to the plane: NaN in the neighbouring planes never leaks in."""
    x = np.full((3, 4, 5, 6), np.nan, np.float32)
    x[1, 2] = RNG.standard_normal((5, 6))
    mid = np.ascontiguousarray(x[1:2, 2:3])
    begins, out, ref = _cols_numpy(mid, (3, 3), [1, 1, 1, 1], [1, 1], [1, 1])
    flat = x.reshape(-1)
    start = (1 * 4 + 2) * 30
    plane = flat[start:start + 30].reshape(1, 1, 5, 6)  # a view into the NaN-surrounded buffer
    np.testing.assert_array_equal(native.im2col2d(plane, 1, (3, 3), out, begins, [1, 1], [1, 1], False), ref)


@needs_ext
@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("m", "k", "n"), [(8, 27, 1024), (3, 8, 100), (1, 5, 16), (7, 300, 40), (8, 16, 17)])
@pytest.mark.parametrize(("lo", "hi", "act"), [(-np.inf, np.inf, 0), (0.0, 6.0, 0), (-np.inf, np.inf, 1)])
def test_narrow_weights_column_task_equals_the_row_task(level, m, k, n, lo, hi, act):
    """From 16 columns on, M <= 8 runs the column task at the AVX2 levels: the same k-order FMA chains
    and epilogue as the row task, which takes blocks of 8 columns, so the same values (NaN kept)."""
    a = RNG.standard_normal((2, m, k)).astype(np.float32)
    x = RNG.standard_normal((1, 2, k, n)).astype(np.float32) * 3
    x[0, 0, 0, 3] = np.nan
    bias = RNG.standard_normal(2 * m).astype(np.float32)
    packed = native.pack_panels(a)
    with native.forced_level(level):
        y = native.sgemm_packed(packed, m, x, bias, lo, hi, act)
        parts = [native.sgemm_packed(packed, m, np.ascontiguousarray(x[..., c:c + 8]), bias, lo, hi, act)
                 for c in range(0, n, 8)]
    np.testing.assert_array_equal(y, np.concatenate(parts, axis=-1))
    ref = np.matmul(a.astype(np.float64), x.astype(np.float64)) + bias.reshape(2, m, 1)
    ref = np.clip(ref, lo, hi)
    if act:
        ref = ref * np.clip(ref / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert np.isnan(y[0, 0, :, 3]).all()


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


@pytest.mark.parametrize(("xs", "ws", "attrs"), [
    ((1, 3, 32, 32), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # UNet's first conv: narrow weights, same rows
    ((1, 8, 32, 32), (3, 8, 1, 1), {}),  # its 1x1 head
    ((2, 16, 8, 8), (16, 16, 3, 3), {"pads": [1, 1, 1, 1], "dilations": [1, 1]}),
    ((1, 8, 9, 9), (5, 8, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
])
def test_narrow_and_same_convs_match_onnxruntime(path, xs, ws, attrs):
    _check_model(_conv_model(xs, ws, attrs, bias=True), xs)
