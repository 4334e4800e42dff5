"""onnx_prepared::MatMulBias (kernels/matmul_bias.py): the native small-product kernel (encoder_gemm.c) and the
BLAS path against onnxruntime's MatMul + Add, at every dispatch level and on numpy: row counts around its
4-row tiles, column tails around its 16-column panels, 1-D and 4-D A, no rows, and a product past
NATIVE_MAX_MACS."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.kernels import matmul_bias as mb
from tests.helpers.dispatch import PATHS, use_path

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _ort(a, w, b):
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                          "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                for k, v in (("a", a), ("w", w), ("b", b))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "w": w, "b": b})[0]


@pytest.mark.parametrize("a_shape,n", [((16, 32), 96), ((2, 8, 32), 128), ((5, 7), 3), ((3, 33), 17), ((32,), 16),
                                       ((2, 2, 3, 8), 31), ((0, 8), 5), ((1, 128), 32), ((300, 64), 64)])
def test_matmul_bias_matches_onnxruntime(path, a_shape, n):
    r = np.random.default_rng(a_shape[-1] * 100 + n)
    a = r.standard_normal(a_shape).astype(np.float32)
    w = r.standard_normal((a_shape[-1], n)).astype(np.float32)
    b = r.standard_normal(n).astype(np.float32)
    want = _ort(a, w, b)
    spec = mb.matmul_bias_rule(None, {}, frozenset({1, 2}), {1: (w.shape, "float32")})
    packed = spec.pack(w)
    for got in (mb.matmul_bias(a, w, b)[0], mb.matmul_bias_packed(packed, a, b)[0], spec.kernel(packed, a, b)[0]):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_strided_a_is_read_as_its_values(path):
    r = np.random.default_rng(3)
    a = r.standard_normal((6, 40)).astype(np.float32)[:, ::2]
    w = r.standard_normal((20, 24)).astype(np.float32)
    b = r.standard_normal(24).astype(np.float32)
    np.testing.assert_allclose(mb.matmul_bias(a, w, b)[0], _ort(np.ascontiguousarray(a), w, b), rtol=1e-5, atol=1e-5)
