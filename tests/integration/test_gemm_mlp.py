"""End to end: a Gemm MLP with constant B (transB 0 and 1, alpha/beta != 1, broadcast C) vs numpy and onnxruntime.

Layer shapes are all different, so a transB mix-up cannot produce a well-shaped wrong answer.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared
from onnx_prepared.model import load_model

ATOL, RTOL = 1e-4, 1e-3
IN = 24
#: (out features, transB, alpha, beta, C shape or None), C shapes broadcast to [batch, out].
LAYERS = (
    (32, 0, 0.5, 2.0, "n"),  # C: [N]
    (16, 1, 1.5, 0.25, "1n"),  # C: [1, N]
    (12, 0, -0.75, 0.5, "scalar"),  # C: []
    (8, 1, 1.25, -1.5, "1"),  # C: [1]
    (5, 1, 0.8, 1.0, None),  # no C
)


def _c_shape(kind: str, n: int) -> tuple[int, ...]:
    return {"n": (n,), "1n": (1, n), "scalar": (), "1": (1,)}[kind]


def build_mlp(folder: str, seed: int = 7) -> tuple[str, list[tuple[np.ndarray, np.ndarray | None]]]:
    """Save the MLP with external weights in ``folder``; returns the path and each layer's (W as stored, C)."""
    rng = np.random.default_rng(seed)
    nodes, inits, params, prev, k = [], [], [], "x", IN
    for i, (n, trans_b, alpha, beta, c_kind) in enumerate(LAYERS):
        w = (rng.standard_normal((n, k) if trans_b else (k, n)) / np.sqrt(k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        ins = [prev, f"W{i}"]
        c = None
        if c_kind is not None:
            c = rng.standard_normal(_c_shape(c_kind, n)).astype(np.float32)
            inits.append(numpy_helper.from_array(c, f"C{i}"))
            ins.append(f"C{i}")
        params.append((w, c))
        nodes.append(helper.make_node("Gemm", ins, [f"g{i}"], name=f"gemm{i}", transB=trans_b, alpha=alpha,
                                      beta=beta))
        prev = f"g{i}"
        if i < len(LAYERS) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
        k = n
    graph = helper.make_graph(
        nodes, "gemm_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", k])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    path = os.path.join(folder, "mlp.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.onnx.data",
              size_threshold=0)
    return path, params


def numpy_mlp(x: np.ndarray, params: list[tuple[np.ndarray, np.ndarray | None]]) -> np.ndarray:
    h = x.astype(np.float64)
    for i, ((w, c), (_, trans_b, alpha, beta, _)) in enumerate(zip(params, LAYERS)):
        h = alpha * (h @ (w.T if trans_b else w))
        if c is not None:
            h = h + beta * c
        if i < len(LAYERS) - 1:
            h = np.maximum(h, 0.0)
    return h


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return build_mlp(str(tmp_path_factory.mktemp("gemm_mlp")))


@pytest.mark.parametrize("batch", [1, 6])
def test_gemm_mlp_matches_numpy(mlp, batch: int) -> None:
    path, params = mlp
    x = np.random.default_rng(batch).standard_normal((batch, IN)).astype(np.float32)
    (y,) = onnx_prepared.InferenceSession(path).run(None, {"x": x})
    assert y.shape == (batch, 5) and y.dtype == np.float32
    np.testing.assert_allclose(y, numpy_mlp(x, params), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("batch", [1, 6])
def test_gemm_mlp_matches_onnxruntime(mlp, batch: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    path, _ = mlp
    x = np.random.default_rng(batch).standard_normal((batch, IN)).astype(np.float32)
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (y,) = onnx_prepared.InferenceSession(path).run(None, {"x": x})
    np.testing.assert_allclose(y, expected, atol=ATOL, rtol=RTOL)


def test_gemm_mlp_weights_are_external(mlp) -> None:
    path, params = mlp
    weights = load_model(path).weights
    assert set(weights) == {f"W{i}" for i in range(len(LAYERS))} | {f"C{i}" for i in range(4)}
    for i, (w, _) in enumerate(params):
        d = weights[f"W{i}"]
        assert d.is_external and d.dims == w.shape and d.payload.length == w.nbytes
