"""The direct unit-stride Conv on the prepacked SGEMM's panels (im2col_direct.c ``conv_direct``, chosen by
conv_prepacked._direct): bit for bit what im2col + the packed SGEMM computes (conv_core) at every dispatch
level, and onnxruntime's values through models at every level and on the numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels import conv_prepacked as cp
from onnx_prepared.kernels import native
from tests.helpers.dispatch import PATHS, use_path
from tests.kernels.test_sgemm_packed import _check_model, _conv_model

RNG = np.random.default_rng(7)
needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")

CASES = [  # (x shape, W shape, attrs): unit strides, output rows at least 3/4 of their 8-column vectors
    ((1, 16, 32, 32), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # UNet's last decoder conv
    ((1, 3, 32, 32), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 5, 7, 13), (19, 5, 3, 3), {"pads": [1, 1, 1, 1]}),  # rows of 13: a partial vector; M past a panel
    ((1, 4, 9, 12), (5, 4, 5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 6, 10, 12), (34, 3, 3, 3), {"group": 2, "pads": [0, 2, 1, 0]}),  # groups of 17 rows, asymmetric pads
    ((2, 3, 8, 16), (4, 3, 3, 1), {"pads": [1, 0, 1, 0]}),  # a column kernel
    ((1, 2, 6, 14), (3, 2, 2, 3), {}),  # no pads: the output is smaller than the input
    ((1, 9, 11, 8), (18, 3, 3, 3), {"group": 3, "auto_pad": "SAME_UPPER"}),
    ((3, 2, 5, 24), (1, 2, 3, 3), {"pads": [1, 1, 1, 1]}),  # one output channel, a batch
]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _spec(ws, attrs):
    class Node:
        domain, op_type = "", "Conv"

    return cp.conv_rule(Node, dict(attrs), frozenset({1, 2}), {1: (ws, "float32"), 2: ((ws[0],), "float32")})


def _is_direct(xs, ws, attrs) -> bool:
    kshape = ws[2:]
    begins, ends, out = sp.geometry("Conv", xs[2:], kshape, auto_pad=attrs.get("auto_pad", "NOTSET"),
                                    pads=attrs.get("pads"), strides=None, dilations=None)
    return cp._direct(native._ext, kshape, [1, 1], [1, 1], begins, ends, out)


@needs_ext
@pytest.mark.parametrize(("xs", "ws", "attrs"), CASES)
@pytest.mark.parametrize(("epilogue", "bias"), [({}, True), ({"lo": 0.0}, False),
                                                 ({"lo": -1.0, "hi": 6.0, "act": 1}, True)])
def test_direct_conv_equals_im2col_sgemm_at_every_level(xs, ws, attrs, epilogue, bias):
    assert _is_direct(xs, ws, attrs)
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32) if bias else None
    spec = _spec(ws, attrs)
    packed, k = spec.pack(w), spec.kernel
    for level in native.supported_levels():
        with native.forced_level(level):
            for _ in range(2):  # the plan is made, then used
                (y,) = k(packed, x, b, **epilogue)
                (ref,) = cp.conv_packed(packed, x, b, kshape=k.kshape, group=k.group, panel_rows=k.panel_rows,
                                        **epilogue, **k.attrs)
                assert y.flags.c_contiguous
                np.testing.assert_array_equal(y, ref)


@needs_ext
def test_narrow_rows_and_strides_stay_on_im2col():
    ext = native._ext
    assert not cp._direct(ext, (3, 3), [1, 1], [1, 1], [1, 1], [1, 1], [4, 4])  # 4 of 8 columns used
    assert not cp._direct(ext, (3, 3), [2, 2], [1, 1], [1, 1], [1, 1], [16, 16])
    assert not cp._direct(ext, (3, 3), [1, 1], [2, 2], [2, 2], [2, 2], [16, 16])
    assert not cp._direct(ext, (1, 1), [1, 1], [1, 1], [0, 0], [0, 0], [16, 16])
    assert not cp._direct(ext, (3, 3), [1, 1], [1, 1], [3, 1], [1, 1], [16, 16])  # a pad as wide as the kernel
    assert cp._direct(ext, (3, 3), [1, 1], [1, 1], [1, 1], [1, 1], [12, 12])
    assert cp._direct(ext, (3, 3), [1, 1], [1, 1], [1, 1], [1, 1], [12, 12], 16)
    if "avx2" in native.supported_levels():  # AVX2's direct tiles beat its SGEMM at every width
        with native.forced_level("avx2"):
            assert cp._direct(ext, (3, 3), [1, 1], [1, 1], [1, 1], [1, 1], [12, 12], 64)
    if "avx512vnni" in native.supported_levels():  # more than one 16-row panel: the AVX-512 SGEMM
        with native.forced_level("avx512vnni"):
            assert not cp._direct(ext, (3, 3), [1, 1], [1, 1], [1, 1], [1, 1], [12, 12], 17)


@needs_ext
def test_direct_conv_checks_its_dims():
    ext = native._ext
    x = np.zeros((1, 2, 4, 8), np.float32)
    packed = np.zeros((1, 1, 18, 16), np.float32)
    y = np.zeros((1, 3, 4, 8), np.float32)
    ok = [1, 2, 4, 8, 1, 3, 3, 3, 4, 8, 1, 1]
    ext.conv_direct(x, packed, None, y, np.array(ok, np.int64), -np.inf, np.inf, 0)
    for i, v in [(10, 3), (11, 3), (8, 1), (1, 3)]:  # pads past the kernel, a short output, channels vs group
        bad = list(ok)
        bad[i] = v
        with pytest.raises(ValueError, match="conv_direct"):
            ext.conv_direct(x, packed, None, y, np.array(bad, np.int64), -np.inf, np.inf, 0)
    with pytest.raises(ValueError, match="smaller than its shape"):
        ext.conv_direct(x, packed, None, y[:, :2], np.array(ok, np.int64), -np.inf, np.inf, 0)


@needs_ext
def test_direct_conv_copies_a_strided_input():
    xs, ws, attrs = CASES[2]
    spec = _spec(ws, attrs)
    packed, k = spec.pack(RNG.standard_normal(ws).astype(np.float32)), spec.kernel
    big = RNG.standard_normal((*xs[:3], 2 * xs[3])).astype(np.float32)
    (y,) = k(packed, big[..., 1::2], None)
    (ref,) = k(packed, np.ascontiguousarray(big[..., 1::2]), None)
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize(("xs", "ws", "attrs"), CASES)
def test_direct_convs_match_onnxruntime(path, xs, ws, attrs):
    _check_model(_conv_model(xs, ws, attrs, bias=True), xs)
