"""MatMulNBits against onnxruntime: bits 2/4/8, zero points absent/packed/float, odd K, N=1, bias, batched A,
accuracy levels 0 and 4, on every compute path: the numpy fallback and each native dispatch level this CPU has."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _q4_panels as q4
from onnx_prepared.kernels import _q8_split as q8
from onnx_prepared.kernels import matmul_nbits as mm
from onnx_prepared.kernels import native
from onnx_prepared.kernels._int4 import pack_bits, unpack_bits
from tests.helpers.dispatch import PATHS, use_path

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


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """The compute path: the numpy fallback (extension switched off) or one native dispatch level."""
    yield from use_path(request.param, monkeypatch)


def _tol(y_ref):
    return {"rtol": 1e-3, "atol": 1e-4 * max(1.0, float(np.abs(y_ref).max()))}


def _close_to_max(got, want, frac=1e-5):
    """max |got - want| within ``frac`` of max |want| (the issue's bound for fp32 and int8 levels)."""
    scale = max(float(np.abs(want).max()), 1e-6)
    assert float(np.abs(got - want).max()) <= frac * scale, (float(np.abs(got - want).max()), scale)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    K=st.integers(16, 300), N=st.integers(1, 40), M=st.sampled_from([1, 2, 3, 5, 7, 33]),
    bits=st.sampled_from([2, 4, 4, 4, 8]), block_size=st.sampled_from([16, 32, 64, 128, 256]),
    zp_kind=st.sampled_from(["none", "packed", "float"]), flat=st.booleans(), with_bias=st.booleans(),
    level=st.sampled_from([0, 4]), seed=st.integers(0, 2**16),
)
def test_matches_onnxruntime(path, K, N, M, bits, block_size, zp_kind, flat, with_bias, level, seed):
    if bits == 8 and zp_kind == "float":
        zp_kind = "packed"  # onnxruntime's CPU provider rejects 8-bit weights with float zero points
    if bits == 2:
        level = 0  # 2 bits stay fp32 (numpy path)
    rng = np.random.default_rng(seed)
    B, scales, zp = _weights(rng, K, N, bits, block_size, zp_kind, flat)
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    A = rng.standard_normal((M, K)).astype(np.float32)
    attrs = {"K": K, "N": N, "bits": bits, "block_size": block_size, "accuracy_level": level}
    want = _ort(A, B, scales, zp, bias, **attrs)
    (got,) = mm.matmul_nbits(A, B, scales, zp, None, bias, **attrs)
    if bits == 4:
        _close_to_max(got, want)
    elif bits == 8:
        # Two nibble halves are summed in float: their rounding scales with the terms, not with the (possibly
        # cancelling) result, so the bound is relative to max(|A| @ |W|), a dot product's rounding scale.
        W = mm.dequantize_matmul_nbits(mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=8,
                                                               block_size=block_size))
        bound = 1e-5 * float((np.abs(A) @ np.abs(W)).max())
        assert float(np.abs(got - want).max()) <= bound, (float(np.abs(got - want).max()), bound)
    else:
        np.testing.assert_allclose(got, want, **_tol(want))


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize(("M", "K", "N", "bs", "zp_kind"), [
    (1, 1024, 80, 32, "none"), (16, 1000, 100, 32, "packed"), (130, 256, 48, 64, "none"),
])
def test_8bit_on_the_native_path_threaded(path, level, M, K, N, bs, zp_kind):
    """8-bit weights as two 4-bit halves: large enough that both phases split over the pool."""
    rng = np.random.default_rng(M + K + N + 8)
    B, scales, zp = _weights(rng, K, N, 8, bs, zp_kind, False)
    bias = rng.standard_normal(N).astype(np.float32)
    A = rng.standard_normal((M, K)).astype(np.float32)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=8, block_size=bs)
    zn = "sym" if zp is None else "zpu8"
    assert packed.nbytes == q8.packed_size(K, N, bs, zn)
    if N % 16 == 0:  # the source's bytes plus one more scale array (and 4-bit zero points of the low half)
        kb = -(-K // bs)
        assert packed.nbytes == B.nbytes + 2 * scales.nbytes + N * kb // (2 if zp is None else 1)
    want = _ort(A, B, scales, zp, bias, K=K, N=N, bits=8, block_size=bs, accuracy_level=level)
    (got,) = mm.matmul_nbits_packed(A, packed, bias, accuracy_level=level)
    _close_to_max(got, want)
    layout = dict(K=K, N=N, block_size=bs, zp_kind=zn)
    payload = packed.to_bytes()  # the companion cache's round trip: no header, the layout key says it all
    assert payload.nbytes == packed.nbytes
    back = q8.PackedQ8Split.from_bytes(payload, **layout)
    np.testing.assert_array_equal(mm.matmul_nbits_packed(A, back, bias, accuracy_level=level)[0], got)
    with pytest.raises(KernelError, match="holds 10 bytes"):
        q8.PackedQ8Split.from_bytes(payload[:10], **layout)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize(("M", "K", "N", "bs", "zp_kind"), [
    (1, 1024, 1024, 32, "none"), (16, 1000, 100, 32, "packed"), (67, 256, 48, 64, "none"),
    (130, 512, 40, 128, "float"), (5, 4096, 64, 256, "packed"),
])
def test_llm_shapes_threaded(path, level, M, K, N, bs, zp_kind):
    """Shapes large enough that both phases split over the native pool."""
    rng = np.random.default_rng(M + K + N)
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, False)
    bias = rng.standard_normal(N).astype(np.float32)
    A = rng.standard_normal((M, K)).astype(np.float32)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    want = _ort(A, B, scales, zp, bias, K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
    (got,) = mm.matmul_nbits_packed(A, packed, bias, accuracy_level=level)
    _close_to_max(got, want)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize(("K", "N", "bs", "zp_kind"), [(100, 1, 32, "none"), (256, 17, 16, "packed"),
                                                     (200, 48, 64, "none"), (130, 33, 128, "packed"),
                                                     (512, 80, 32, "packed")])
def test_tile_edges(path, level, K, N, bs, zp_kind):
    """Row counts around the kernels' tile heights (1, 4 and 8 rows; row chunks of 32) and odd panel counts,
    with bias; the result does not depend on how the pool splits the work (1 thread vs all)."""
    rng = np.random.default_rng(K * N + bs)
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, False)
    bias = rng.standard_normal(N).astype(np.float32)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    for M in (2, 3, 4, 5, 7, 8, 9, 31, 33, 36, 37):
        A = rng.standard_normal((M, K)).astype(np.float32)
        want = _ort(A, B, scales, zp, bias, K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
        (got,) = mm.matmul_nbits_packed(A, packed, bias, accuracy_level=level)
        _close_to_max(got, want)
        if path != "numpy":
            threads = native.get_num_threads()
            native.set_num_threads(1)
            try:
                (one,) = mm.matmul_nbits_packed(A, packed, bias, accuracy_level=level)
            finally:
                native.set_num_threads(threads)
            np.testing.assert_array_equal(one, got)


@pytest.mark.skipif(len(native.supported_levels()) < 2, reason="no SIMD dispatch level on this CPU")
@pytest.mark.parametrize("level", [0, 4])
def test_simd_levels_agree_with_portable(level):
    """The portable kernel is the oracle of every SIMD level (int8: integer dots, so nearly bit-exact)."""
    rng = np.random.default_rng(11)
    for M, K, N, bs, zk in [(1, 300, 37, 32, "packed"), (9, 256, 64, 16, "none"), (6, 200, 20, 64, "float")]:
        B, scales, zp = _weights(rng, K, N, 4, bs, zk, False)
        A = rng.standard_normal((M, K)).astype(np.float32)
        packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
        with native.forced_level("portable"):
            (ref,) = mm.matmul_nbits_packed(A, packed, accuracy_level=level)
        for isa in native.supported_levels()[1:]:
            with native.forced_level(isa):
                (got,) = mm.matmul_nbits_packed(A, packed, accuracy_level=level)
            _close_to_max(got, ref, 1e-6)



@pytest.mark.skipif(len(native.supported_levels()) < 2, reason="no SIMD dispatch level on this CPU")
@pytest.mark.parametrize(("M", "K", "bs", "zk"), [(1, 200, 32, "none"), (9, 200, 32, "packed"), (12, 256, 16, "none"),
                                               (3, 130, 64, "packed")])
def test_int8_ties_quantize_identically_at_every_level(M, K, bs, zk):
    """A made of exact half-way values (a * 127/amax = n + 0.5) and a tail block: every SIMD level's
    vectorized quantization of A must round them as the portable one does (one flipped tie moves the
    output by ~1e-3 of max|Y|, far above the bound)."""
    rng = np.random.default_rng(M * K)
    A = (rng.integers(-126, 127, (M, K)) + 0.5).astype(np.float32)
    A[:, ::bs] = 127.0  # amax = 127 in every block, so the scale is 1 and a * 127/amax = a exactly
    B, scales, zp = _weights(rng, K, 24, 4, bs, zk, False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=24, bits=4, block_size=bs)
    with native.forced_level("portable"):
        (ref,) = mm.matmul_nbits_packed(A, packed, accuracy_level=4)
    for isa in native.supported_levels()[1:]:
        with native.forced_level(isa):
            (got,) = mm.matmul_nbits_packed(A, packed, accuracy_level=4)
        _close_to_max(got, ref, 1e-6)
    want = _ort(A, B, scales, zp, None, K=K, N=24, bits=4, block_size=bs, accuracy_level=4)
    _close_to_max(ref, want)

def test_int8_quantization_of_a_is_onnxruntimes():
    """Half-way values round to even, the scale is amax/127 with q = a * (127/amax): ties resolve as in MLAS."""
    a = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 63.5, -127.0] * 2], np.float32)
    q, s = q4.quantize_a_int8(a, 16)
    assert s[0, 0] == np.float32(1.0)
    np.testing.assert_array_equal(q[0, 0, :8], [127, 0, 2, 2, 0, -2, 64, -127])


@pytest.mark.parametrize("bits", [4, 8])
def test_prepacked_entry_point_batched_input_and_panels(path, monkeypatch, bits):
    monkeypatch.setattr(mm, "PANEL_BYTES", 4 * 32 * 40)  # 8 bits: one block per panel, exercises accumulation
    rng = np.random.default_rng(3)
    K, N, bs = 100, 40, 32
    B, scales, zp = _weights(rng, K, N, bits, bs, "packed", False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=bits, block_size=bs)
    if bits == 4:
        assert packed.layout == f"matmul-nbits-q4-panel16-v{q4.LAYOUT_VERSION}-block32-zpu4-k{K}-n{N}"
    else:
        assert isinstance(packed, q8.PackedQ8Split)
    for shape in [(1, 1, K), (2, 3, K), (9, K)]:
        A = rng.standard_normal(shape).astype(np.float32)
        want = _ort(A, B, scales, zp, None, K=K, N=N, bits=bits, block_size=bs)
        (got,) = mm.matmul_nbits_packed(A, packed)
        assert got.shape == shape[:-1] + (N,)
        np.testing.assert_allclose(got, want, **_tol(want))


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_short_path_gives_the_general_paths_bits(path, level, zp_kind):
    """4-bit float32 C-contiguous A without bias takes matmul_nbits_packed's short path (A as it is, the
    extension's own A scratch); a strided copy of the same A, or a zero bias, takes the general one: same bits."""
    rng = np.random.default_rng(11)
    K, N, bs = 200, 48, 32
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    for shape in [(1, K), (2, 3, K), (17, K)]:
        A = rng.standard_normal(shape).astype(np.float32)
        strided = np.empty(shape[:-1] + (2 * K,), np.float32)[..., ::2]
        strided[...] = A
        (short,) = mm.matmul_nbits_packed(A, packed, accuracy_level=level)
        (general,) = mm.matmul_nbits_packed(strided, packed, accuracy_level=level)
        (biased,) = mm.matmul_nbits_packed(A, packed, np.zeros(N, np.float32), accuracy_level=level)
        assert short.shape == shape[:-1] + (N,) and short.dtype == np.float32
        np.testing.assert_array_equal(short, general)
        np.testing.assert_array_equal(short, biased)
        want = _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=bs, accuracy_level=level)
        np.testing.assert_allclose(short, want, **_tol(want))


@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_packed_layout_round_trips_through_bytes_and_dequantizes(zp_kind):
    rng = np.random.default_rng(4)
    K, N, bs = 70, 21, 16
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, zp_kind != "float")
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    payload = packed.to_bytes()
    assert payload.nbytes == packed.nbytes  # no header: the layout key names K, N, block size, zero points
    layout = dict(K=K, N=N, block_size=bs, zp_kind=packed.zp_kind)
    back = q4.PackedQ4.from_bytes(payload, **layout)
    assert back.layout == packed.layout and (back.K, back.N, back.zp_kind) == (K, N, packed.zp_kind)
    np.testing.assert_array_equal(back.data, packed.data)
    q = unpack_bits(B.reshape(N, -1), 4).astype(np.float32)[:, :K]  # [N, K]
    if zp_kind == "packed":
        z = unpack_bits(zp.reshape(N, -1), 4, 5).astype(np.float32)
    elif zp_kind == "float":
        z = zp.reshape(N, -1)
    else:
        z = np.full((N, 5), 8.0, np.float32)
    w = (q - np.repeat(z, bs, axis=1)[:, :K]) * np.repeat(scales.reshape(N, -1), bs, axis=1)[:, :K]
    np.testing.assert_allclose(mm.dequantize_matmul_nbits(back), w.T, rtol=1e-6, atol=1e-6)
    with pytest.raises(KernelError, match="holds"):
        q4.PackedQ4.from_bytes(payload[:-1], **layout)


@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_packed_bytes_no_larger_than_source(zp_kind):
    """Bytes moved are the M=1 limit: N a multiple of 16 packs to exactly the source size (no offsets)."""
    rng = np.random.default_rng(5)
    K, N, bs = 256, 48, 32
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    assert packed.nbytes == B.nbytes + scales.nbytes + (0 if zp is None else zp.nbytes)


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
    zname = "zpu4" if with_zp else "sym"
    assert spec is not None and spec.layout == f"matmul-nbits-q4-panel16-v{q4.LAYOUT_VERSION}-block32-{zname}-k{K}-n{N}"
    assert spec.source_inputs == ((1, 2, 3) if with_zp else (1, 2))
    packed = spec.pack(*[consts[i] for i in spec.source_inputs])
    assert spec.packed_bytes == packed.nbytes
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
