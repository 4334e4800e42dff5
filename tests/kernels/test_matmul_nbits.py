"""MatMulNBits against onnxruntime: bits 2/4/8, zero points absent/packed/float, odd K, N=1, bias, batched A,
on the compute path (numpy dequantized panels + BLAS)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import matmul_nbits as mm
from onnx_prepared.kernels._int4 import pack_bits, unpack_bits

ort = pytest.importorskip("onnxruntime")


def _ort(A, B, scales, zp, bias, *, K, N, bits, block_size, accuracy_level=0):
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "S")]
    names = ["A", "B", "S", "", "", ""]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "Z"))
        names[3] = "Z"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
        names[5] = "bias"
    while not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)
    et = helper.np_dtype_to_tensor_dtype(A.dtype)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", et, A.shape)],
                          [helper.make_tensor_value_info("Y", et, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]


def _weights(rng, K, N, bits, block_size, zp_kind, flat):
    kb = -(-K // block_size)
    B = rng.integers(0, 256, (N, kb, block_size * bits // 8), dtype=np.uint8)
    scales = (rng.random((N, kb), dtype=np.float32) * 0.1 + 0.01).astype(np.float32)
    zp = None
    if zp_kind == "packed":
        zp = pack_bits(rng.integers(0, 1 << bits, (N, kb)), bits)
    elif zp_kind == "float":
        zp = (rng.random((N, kb), dtype=np.float32) * (1 << bits)).astype(np.float32)
    if flat:
        scales = scales.reshape(-1)
        zp = None if zp is None or zp_kind == "float" else zp.reshape(-1)
    return B, scales, zp


@pytest.fixture(params=["numpy"])
def path(request):
    """The compute path a test runs on (one today: numpy panels + BLAS)."""
    return request.param


def _tol(y_ref):
    return {"rtol": 1e-3, "atol": 1e-4 * max(1.0, float(np.abs(y_ref).max()))}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    K=st.integers(16, 160), N=st.integers(1, 24), M=st.sampled_from([1, 2, 3, 7]),
    bits=st.sampled_from([2, 4, 8]), block_size=st.sampled_from([16, 32, 64]),
    zp_kind=st.sampled_from(["none", "packed", "float"]), flat=st.booleans(), with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_onnxruntime(path, K, N, M, bits, block_size, zp_kind, flat, with_bias, seed):
    if bits == 8 and zp_kind == "float":
        zp_kind = "packed"  # onnxruntime's CPU provider rejects 8-bit weights with float zero points
    rng = np.random.default_rng(seed)
    B, scales, zp = _weights(rng, K, N, bits, block_size, zp_kind, flat)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    A = rng.standard_normal((M, K)).astype(np.float32)
    attrs = {"K": K, "N": N, "bits": bits, "block_size": block_size}
    want = _ort(A, B, scales, zp, bias, **attrs)
    (got,) = mm.matmul_nbits(A, B, scales, zp, None, bias, **attrs)
    np.testing.assert_allclose(got, want, **_tol(want))


def test_prepacked_entry_point_batched_input_and_panels(path, monkeypatch):
    monkeypatch.setattr(mm, "PANEL_BYTES", 4 * 32 * 40)  # one block per panel: exercises accumulation
    rng = np.random.default_rng(3)
    K, N, bs = 100, 40, 32
    B, scales, zp = _weights(rng, K, N, 4, bs, "packed", False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    assert packed.layout == "matmul-nbits-q4-kmajor-u32-block32"
    assert packed.words.shape == (4, 4, N) and packed.words.dtype == np.uint32
    for shape in [(1, 1, K), (2, 3, K), (9, K)]:
        A = rng.standard_normal(shape).astype(np.float32)
        want = _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=bs)
        (got,) = mm.matmul_nbits_packed(A, packed)
        assert got.shape == shape[:-1] + (N,)
        np.testing.assert_allclose(got, want, **_tol(want))


def test_packed_layout_round_trips_through_bytes_and_dequantizes():
    rng = np.random.default_rng(4)
    K, N, bs = 70, 5, 16
    B, scales, zp = _weights(rng, K, N, 4, bs, "packed", True)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    back = mm.PackedNBits.from_bytes(packed.to_bytes())
    assert back.layout == packed.layout and back.K == K and back.N == N
    np.testing.assert_array_equal(back.words, packed.words)
    np.testing.assert_array_equal(back.offsets, packed.offsets)
    q = unpack_bits(B.reshape(N, -1), 4).astype(np.float32)[:, :K]  # [N, K]
    z = unpack_bits(zp.reshape(N, -1), 4, 5).astype(np.float32)
    w = (q - np.repeat(z, bs, axis=1)[:, :K]) * np.repeat(scales.reshape(N, -1), bs, axis=1)[:, :K]
    np.testing.assert_allclose(mm.dequantize_matmul_nbits(back), w.T, rtol=1e-6, atol=1e-6)


def test_accuracy_level_4_within_stated_bound():
    # onnxruntime quantizes A to int8 per block at level 4; we stay fp32. Documented bound: 2% of max |y|.
    rng = np.random.default_rng(5)
    K, N, bs = 256, 32, 32
    B, scales, _ = _weights(rng, K, N, 4, bs, "none", False)
    A = rng.standard_normal((4, K)).astype(np.float32)
    want = _ort(A, B, scales, None, None, K=K, N=N, bits=4, block_size=bs, accuracy_level=4)
    (got,) = mm.matmul_nbits(A, B, scales, K=K, N=N, bits=4, block_size=bs, accuracy_level=4)
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def test_float16_input():
    rng = np.random.default_rng(6)
    K, N, bs = 64, 16, 32
    B, scales, _ = _weights(rng, K, N, 4, bs, "none", False)
    A = rng.standard_normal((3, K)).astype(np.float16)
    want = _ort(A, B, scales.astype(np.float16), None, None, K=K, N=N, bits=4, block_size=bs)
    (got,) = mm.matmul_nbits(A, B, scales.astype(np.float16), K=K, N=N, bits=4, block_size=bs)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_empty_weights_give_bias_and_bad_inputs_raise():
    A = np.ones((2, 32), np.float32)
    bias = np.arange(3, dtype=np.float32)
    (y,) = mm.matmul_nbits(A, np.zeros((0, 1, 16), np.uint8), np.zeros(0, np.float32), None, None, bias,
                           K=32, N=3, block_size=32)
    np.testing.assert_array_equal(y, np.broadcast_to(bias, (2, 3)))
    B = np.zeros((3, 1, 16), np.uint8)
    S = np.ones(3, np.float32)
    (y,) = mm.matmul_nbits(A, B, S, None, np.zeros(32, np.int32), K=32, N=3, block_size=32)  # trivial g_idx
    np.testing.assert_array_equal(y, np.full((2, 3), -8 * 32, np.float32))
    with pytest.raises(KernelError, match="g_idx"):
        mm.matmul_nbits(A, B, S, None, np.arange(32, dtype=np.int32) % 2, K=32, N=3, block_size=32)
    with pytest.raises(KernelError, match="weight_prepacked"):
        mm.matmul_nbits(A, B, S, K=32, N=3, block_size=32, weight_prepacked=1)
    with pytest.raises(KernelError, match="bits=3"):
        mm.matmul_nbits(A, B, S, K=32, N=3, block_size=32, bits=3)
    with pytest.raises(KernelError, match="B must be uint8"):
        mm.matmul_nbits(A, B[:, :, :8], S, K=32, N=3, block_size=32)


def test_model_written_by_onnxruntime_quantizer():
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(8)
    K, N = 96, 20
    W = rng.standard_normal((K, N)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"])], "g",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, N])],
                          [numpy_helper.from_array(W, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False)
    q.process()
    qm = q.model.model
    (node,) = qm.graph.node
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    A = rng.standard_normal((3, K)).astype(np.float32)
    want = ort.InferenceSession(qm.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": A})[0]
    (got,) = mm.matmul_nbits(A, *[inits[n] for n in node.input[1:]], **attrs)
    np.testing.assert_allclose(got, want, **_tol(want))
    np.testing.assert_allclose(got, A @ W, atol=0.3 * np.abs(A @ W).max())  # and it approximates the fp32 MatMul


@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_prepack_rule_contract(with_zp, with_bias):
    """The prepared-execution contract: pack(*sources) once, then kernel(packed, A, *other inputs)."""
    from onnx_prepared.bind import parse_attributes
    from onnx_prepared.kernels import prepack

    rng = np.random.default_rng(9)
    K, N, bs = 72, 12, 32
    B, scales, zp = _weights(rng, K, N, 4, bs, "packed" if with_zp else "none", False)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    names = ["A", "B", "S", "Z" if with_zp else "", "", "bias" if with_bias else ""]
    while not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=bs)
    consts = {1: B, 2: scales} | ({3: zp} if with_zp else {}) | ({5: bias} if with_bias else {})
    shapes = {i: (a.shape, a.dtype.name) for i, a in consts.items()}
    spec = prepack.match(node, parse_attributes(node), frozenset(consts), shapes)
    assert spec is not None and spec.layout == f"matmul-nbits-q4-kmajor-u32-block32-k{K}-n{N}"
    assert spec.source_inputs == ((1, 2, 3) if with_zp else (1, 2))
    packed = spec.pack(*[consts[i] for i in spec.source_inputs])
    packed = spec.from_bytes(spec.to_bytes(packed))  # as a persisted cache entry would come back
    values = {0: rng.standard_normal((2, K)).astype(np.float32)} | consts
    others = [values.get(i) if n else None for i, n in enumerate(names) if i not in spec.source_inputs]
    (got,) = spec.kernel(packed, *others)
    want = _ort(values[0], B, scales, zp, bias, K=K, N=N, bits=4, block_size=bs)
    np.testing.assert_allclose(got, want, **_tol(want))


def test_prepack_rule_declines_non_constant_weights():
    from onnx_prepared.bind import parse_attributes
    from onnx_prepared.kernels import prepack

    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=32, N=4, block_size=32)
    shapes = {2: ((4, 1), "float32")}
    assert prepack.match(node, parse_attributes(node), frozenset(shapes), shapes) is None
