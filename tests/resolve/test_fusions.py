"""DequantizeLinear (blocked INT4, axis 0) + MatMul bound to the native MatMulNBits path: the fusion fires
exactly on the pattern, and the fused node computes what onnxruntime computes (its own fusion at
``qdq_matmulnbits_accuracy_level=0``, i.e. fp32), at every dispatch level and on numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnx_prepared
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from tests.helpers.dispatch import PATHS, use_path

ort = pytest.importorskip("onnxruntime")


def _model(path, K, N, bs, *, signed=True, zp=False, rank=2, axis=0, extra_use=False, seed=0, as_output=False):
    rng = np.random.default_rng(seed)
    lo, hi = (-8, 8) if signed else (0, 16)
    sdims = [-(-K // bs), N] if axis == 0 else [K, -(-N // bs)]
    x = rng.integers(lo, hi, (K, N))
    s = (rng.random(sdims) * 0.05 + 0.01).astype(np.float32)
    et = TensorProto.INT4 if signed else TensorProto.UINT4
    inits = [helper.make_tensor("x", et, [K, N], x.reshape(-1).tolist()), helper.make_tensor("s", TensorProto.FLOAT,
             sdims, s.reshape(-1).tolist())]
    dq_in = ["x", "s"]
    if zp:
        inits.append(helper.make_tensor("z", et, sdims, rng.integers(lo, hi, sdims).reshape(-1).tolist()))
        dq_in.append("z")
    nodes = [helper.make_node("DequantizeLinear", dq_in, ["W"], axis=axis, block_size=bs),
             helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")]
    a_shape = ["M", K] if rank == 2 else [2, "M", K]
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("ReduceSum", ["W"], ["R"], keepdims=0))
        outs.append(helper.make_tensor_value_info("R", TensorProto.FLOAT, None))
    if as_output:
        outs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_shape)], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    p = str(path / "m.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


def _ort(p, A):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    s = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
    return s.run(None, {"A": A})


def _choices(p):
    return resolve_model(load_model(p)).kernel_choices


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(K=st.integers(16, 200), N=st.integers(1, 40), M=st.sampled_from([1, 3, 7, 16]),
       bs=st.sampled_from([16, 32, 64, 128]), signed=st.booleans(), zp=st.booleans(), rank=st.sampled_from([2, 3]),
       seed=st.integers(0, 2**16))
def test_fused_pair_matches_onnxruntime(tmp_path_factory, path, K, N, M, bs, signed, zp, rank, seed):
    p = _model(tmp_path_factory.mktemp("m"), K, N, bs, signed=signed, zp=zp, rank=rank, seed=seed)
    assert [c.split("-")[0] for c in _choices(p)] == ["prepacked:dq"]  # one fused node, DequantizeLinear gone
    A = np.random.default_rng(seed).standard_normal((M, K) if rank == 2 else (2, M, K)).astype(np.float32)
    (want,) = _ort(p, A)
    (got,) = onnx_prepared.InferenceSession(p).run(None, {"A": A})
    assert got.shape == want.shape and got.dtype == np.float32
    scale = max(float(np.abs(want).max()), 1e-6)
    assert float(np.abs(got - want).max()) <= 1e-5 * scale


@pytest.mark.parametrize("variant", [{"axis": 1}, {"extra_use": True}, {"as_output": True}])
def test_pattern_mismatch_is_left_as_written(tmp_path, variant):
    K, N = (64, 64)
    p = _model(tmp_path, K, N, 32, **variant)
    choices = _choices(p)
    assert not any(c.startswith("prepacked:dq") for c in choices)
    assert any("DequantizeLinear" in c for c in choices)
    A = np.random.default_rng(1).standard_normal((3, K)).astype(np.float32)
    want = _ort(p, A)
    got = onnx_prepared.InferenceSession(p).run(None, {"A": A})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_block_size_the_kernel_lacks_is_left_as_written(tmp_path):
    p = _model(tmp_path, 40, 8, 8)
    assert not any(c.startswith("prepacked:dq") for c in _choices(p))
