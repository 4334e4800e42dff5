"""Gemm's bound call (gemm._gemm_bound, registry.specializes) for alpha = beta = 1: float32 2-D operands
straight to matmul with the transposes settled at binding; the same values as the kernel (and so as
onnxruntime) for every transpose and bias broadcast, and the kernel's errors for anything else."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_prepared.bind import bind_node
from onnx_prepared.bind.kernel import specialize_constants
from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import gemm as gm
from tests.kernels.onnx_node_check import run_ort

RNG = np.random.default_rng(5)


def _calls(n_inputs: int, **attrs):
    node = helper.make_node("Gemm", [f"i{i}" for i in range(n_inputs)], ["y"], **attrs)
    k = bind_node(node, {"": 13})
    return k.call, specialize_constants(k, {}, n_inputs).call


@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("cshape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_bound_gemm_equals_the_kernel_and_onnxruntime(ta, tb, cshape):
    a = RNG.standard_normal((4, 3) if ta else (3, 4)).astype(np.float32)
    b = RNG.standard_normal((5, 4) if tb else (4, 5)).astype(np.float32)
    ins = [a, b] + ([] if cshape is None else [RNG.standard_normal(cshape).astype(np.float32)])
    plain, bound = _calls(len(ins), transA=ta, transB=tb)
    assert bound is not plain
    (y,) = bound(*ins)
    np.testing.assert_array_equal(y, plain(*ins)[0])
    np.testing.assert_allclose(y, run_ort("Gemm", ins, opset=13, transA=ta, transB=tb)[0], rtol=1e-5, atol=1e-5)


def test_other_coefficients_keep_the_kernel():
    plain, bound = _calls(3, alpha=0.5)
    assert bound is plain


def test_other_types_and_bad_operands_go_through_the_kernel():
    _, bound = _calls(3, transB=1)
    a, b, c = (RNG.standard_normal(s) for s in ((3, 4), (5, 4), (5,)))
    np.testing.assert_array_equal(bound(a, b, c)[0], gm.gemm(a, b, c, transB=1)[0])  # float64
    with pytest.raises(KernelError, match="2-D"):
        bound(np.zeros(4, np.float32), np.zeros((5, 4), np.float32))
    with pytest.raises(KernelError, match="one element type"):
        bound(np.zeros((3, 4), np.float32), np.zeros((5, 4), np.float32), np.zeros(5, np.float64))
