"""A float32 Gemm with a constant B on ``sgemm_packed``'s panels of ``op(B)^T`` (gemm_prepacked.PanelGemm,
layout ``gemm-b-p16``): every transpose, row count, C broadcast and coefficient against onnxruntime on
every compute path (the numpy one unpacks the panels), the plan kept per A shape and remade for another
C, and a session choosing the layout."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import gemm_prepacked as gp
from onnx_prepared.kernels import native
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.dispatch import PATHS, use_path
from tests.kernels.onnx_node_check import run_ort

RNG = np.random.default_rng(41)
needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


class _Node:
    domain, op_type = "", "Gemm"


def _spec(bshape, **attrs):
    return gp.gemm_rule(_Node, attrs, frozenset({1}), {1: (bshape, "float32")})


@needs_ext
@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("m", [1, 3, 70])
@pytest.mark.parametrize("cshape", [None, (), (21,), (1, 21), ("m", 1), ("m", 21)])
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
def test_panel_gemm_matches_onnxruntime(path, ta, tb, m, cshape, alpha, beta):
    k, n = 19, 21
    a = RNG.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    ins = [a, b]
    if cshape is not None:
        ins.append(RNG.standard_normal(tuple(m if d == "m" else d for d in cshape)).astype(np.float32))
    attrs = {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
    from onnx_prepared.kernels._native import _ext

    with pytest.MonkeyPatch.context() as mp:  # the panels are packed where the extension is; the numpy path
        mp.setattr(native, "_ext", _ext)     # (no extension at the call) unpacks them
        spec = gp.gemm_rule(_Node, attrs, frozenset({1}), {1: (b.shape, "float32")})
    assert spec.layout.startswith("gemm-b-p16-")
    packed = spec.pack(b)
    (expected,) = run_ort("Gemm", ins, opset=13, **attrs)
    for _ in range(2):  # the plan is made, then used
        (y,) = spec.kernel(packed, a, *ins[2:])
        assert y.shape == expected.shape and y.flags.c_contiguous
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@needs_ext
def test_a_new_c_or_another_row_count_is_planned_again():
    spec = _spec((6, 4), transB=1)
    b = RNG.standard_normal((6, 4)).astype(np.float32)
    packed, k = spec.pack(b), spec.kernel
    for m in (1, 2, 1):
        a = RNG.standard_normal((m, 4)).astype(np.float32)
        for c in (RNG.standard_normal(6).astype(np.float32), RNG.standard_normal((m, 6)).astype(np.float32)):
            np.testing.assert_allclose(k(packed, a, c)[0], a @ b.T + c, rtol=1e-5, atol=1e-5)
    assert len(k._plans) == 2


@needs_ext
def test_other_types_and_bad_operands_take_the_general_kernel():
    spec = _spec((6, 4), transB=1)
    b = RNG.standard_normal((6, 4)).astype(np.float32)
    packed, k = spec.pack(b), spec.kernel
    with pytest.raises(KernelError, match="2-D"):
        k(packed, np.zeros(4, np.float32))
    with pytest.raises(KernelError, match="one element type"):
        k(packed, np.zeros((3, 4)), np.zeros(6))
    with pytest.raises(ValueError):
        k(packed, np.zeros((3, 5), np.float32))


def test_a_session_runs_the_head_gemm_on_panels(tmp_path):
    w = RNG.standard_normal((5, 32)).astype(np.float32)
    c = RNG.standard_normal(5).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "C"], ["y"], transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(c, "C")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    p = str(tmp_path / "g.onnx")
    onnx.save(model, p)
    import onnxruntime as ort

    o = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    with RuntimeSession(p) as s:
        layouts = [k for k in s.resolved.kernel_choices if k.startswith("prepacked:")]
        assert layouts == [f"prepacked:gemm-b-{'p16' if native.available() else 'kn'}-float32-k32-n5-transB1-alpha1.0"]
        for n in (1, 2, 1):
            x = RNG.standard_normal((n, 32)).astype(np.float32)
            np.testing.assert_allclose(s.run({"x": x})[0], o.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
