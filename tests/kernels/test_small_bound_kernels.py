"""The bound calls of small CNN-head kernels (built once when the plan is bound: LeakyRelu with a slope in
[0, 1] as ``max(x, alpha * x)``, Flatten at axis 1 as ``reshape(N, -1)``, GlobalMaxPool in ``gap.c``)
run through a whole session against onnxruntime, on every compute path, edge values included."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path

RNG = np.random.default_rng(31)
EDGES = np.array([0.0, -0.0, 1e-30, -1e-30, 3.5, -3.5, 1e4, -1e4, np.inf, -np.inf, np.nan], np.float32)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _model(tmp_path, op, x, opset=13, name="m.onnx", **attrs):
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", elem, ["n", *["?"] * (x.ndim - 1)] if x.ndim
                                                             else [])],
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    p = str(tmp_path / name)
    onnx.save(model, p)
    return p


def _same_as_ort(p, x, exact=True, expected=None):
    """Our session's output against onnxruntime's (or ``expected``, for the types onnxruntime lacks)."""
    import onnxruntime as ort

    if expected is None:
        (expected,) = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with RuntimeSession(p) as s:
        for _ in range(2):  # the bound call is made, then reused
            (got,) = s.run({"x": x})
            assert got.shape == expected.shape and got.dtype == expected.dtype
            if exact:
                np.testing.assert_array_equal(got, expected)
            else:
                np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.1, 1.0, 1.5, -0.25])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_leaky_relu_matches_onnxruntime_for_any_slope(tmp_path, alpha, dtype):
    x = np.concatenate([EDGES, (RNG.standard_normal(40) * 3).astype(np.float32)]).astype(dtype).reshape(1, 3, -1)
    with np.errstate(invalid="ignore"):  # onnxruntime has no float64 LeakyRelu: its formula
        ref = np.where(x >= 0, x, x * np.float64(np.float32(alpha))) if dtype == np.float64 else None
    _same_as_ort(_model(tmp_path, "LeakyRelu", x, alpha=alpha), x, exact=dtype != np.float16, expected=ref)


def test_leaky_relu_keeps_the_sign_of_zero(tmp_path):
    x = np.array([[-0.0, 0.0, -1.0]], np.float32)
    with RuntimeSession(_model(tmp_path, "LeakyRelu", x, alpha=0.5)) as s:
        (y,) = s.run({"x": x})
    assert np.signbit(y).ravel().tolist() == [True, False, True]


@pytest.mark.parametrize("shape", [(2, 5, 7, 3), (0, 4, 2, 2), (3, 6), (4,), (1, 32, 1, 1)])
def test_flatten_at_axis_one_matches_onnxruntime(tmp_path, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    _same_as_ort(_model(tmp_path, "Flatten", x), x)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([(1, 16, 4, 4), (2, 3, 7), (2, 5, 1, 1), (1, 2, 3, 3, 2), (3, 4, 17, 1)]),
       nan_at=st.one_of(st.none(), st.integers(0, 200)), scale=st.sampled_from([1.0, 1e4]))
def test_global_max_pool_matches_onnxruntime(tmp_path_factory, path, shape, nan_at, scale):
    # NOTE: no -inf alone in a plane: onnxruntime's GlobalMaxPool starts from float32 lowest (-3.4e38 for a
    # plane of -inf; the max of {-inf} is -inf, which we return), and it skips NaN where we propagate it
    # as numpy's maximum.reduce and our MaxPool do (the plane with a NaN is checked against numpy)
    x = (RNG.standard_normal(shape) * scale).astype(np.float32)
    x.flat[-1] = np.inf
    p = _model(tmp_path_factory.mktemp("gmp"), "GlobalMaxPool", x)
    _same_as_ort(p, x)
    if nan_at is not None:
        x.flat[nan_at % x.size] = np.nan
        _same_as_ort(p, x, expected=np.maximum.reduce(x.reshape(*x.shape[:2], -1), axis=2).reshape(
            x.shape[:2] + (1,) * (x.ndim - 2)))


def test_global_max_pool_of_a_strided_or_float64_input(tmp_path):
    x = RNG.standard_normal((2, 3, 6, 6))  # onnxruntime has no float64 GlobalMaxPool
    _same_as_ort(_model(tmp_path, "GlobalMaxPool", x), x, expected=x.max(axis=(2, 3), keepdims=True))
    from onnx_prepared.kernels.pool import _global_max_pool_flat

    xs = RNG.standard_normal((2, 3, 6, 12)).astype(np.float32)[..., ::2]
    np.testing.assert_array_equal(_global_max_pool_flat(xs)[0], xs.max(axis=(2, 3), keepdims=True))


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_bound_concat_matches_the_kernel(n, axis):
    """Concat's bound closure (two inputs without the packing, any count) gives the kernel's values and
    numpy's error on mismatched shapes; no axis keeps the kernel."""
    from onnx_prepared.kernels import shape_ops

    xs = [RNG.standard_normal((2, 3, 1 + i)).astype(np.float32) for i in range(n)]
    xs = [x if axis == -1 else np.ascontiguousarray(np.moveaxis(x, -1, axis)) for x in xs]
    bound = shape_ops._concat_bound({}, n, axis=axis)
    np.testing.assert_array_equal(bound(*xs)[0], shape_ops.concat(*xs, axis=axis)[0])
    assert shape_ops._concat_bound({}, n) is None
    if n > 1:
        with pytest.raises(ValueError):
            bound(*xs[:-1], np.zeros((5, 5, 5, 5), np.float32))
