"""End to end: the checked-in tiny Llama fixtures through onnx_prepared, against torch and onnxruntime.

Fixtures come from ``tests/fixtures/make_llama.py`` (TorchScript and dynamo exports of one seeded decoder)
and ``tests/fixtures/make_quantized.py`` (QDQ INT4 and MatMulNBits variants). Each folder's
``reference.npz`` holds ``input_ids_<seq>`` feeds for two sequence lengths (the exports have a dynamic
``seq`` axis) and ``logits_<seq>``: torch's output for the float exports, onnxruntime's for the
quantized ones.
"""

from __future__ import annotations

import functools
import itertools
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import onnx_prepared
from onnx_prepared.model import load_model

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SEQS = (7, 12)
ATOL, RTOL = 1e-4, 1e-3

FLOAT = ("llama_ts", "llama_dynamo")
QDQ = ("llama_qdq_int4",)
NBITS = ("llama_nbits_sym", "llama_nbits_asym")
NBITS_GATHER = ("llama_nbits_gather_sym", "llama_nbits_gather_asym")


ALL = FLOAT + QDQ + NBITS + NBITS_GATHER


def model_path(name: str) -> str:
    return os.path.join(FIXTURES, name, "model.onnx")


@functools.cache
def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(FIXTURES, name, "reference.npz")) as z:
        return {k: z[k] for k in z.files}


@functools.cache
def ours(name: str) -> onnx_prepared.InferenceSession:
    return onnx_prepared.InferenceSession(model_path(name))


@functools.cache
def ort_session(name: str):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # NOTE: by default ORT fuses DequantizeLinear+MatMul into MatMulNBits with accuracy_level 4, which
    # quantizes activations to int8 and moves the QDQ logits by ~1e-2; level 0 keeps float math.
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(model_path(name), so, providers=["CPUExecutionProvider"])


def run_ours(name: str, seq: int) -> np.ndarray:
    (logits,) = ours(name).run(None, {"input_ids": reference(name)[f"input_ids_{seq}"]})
    return logits


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape and actual.dtype == np.float32
    diff = float(np.abs(actual.astype(np.float64) - expected).max())
    np.testing.assert_allclose(actual, expected, atol=ATOL, rtol=RTOL, err_msg=f"max abs diff {diff:.3g}")


@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("name", FLOAT)
def test_float_export_matches_torch(name: str, seq: int) -> None:
    ref = reference(name)
    logits = run_ours(name, seq)
    assert logits.shape == (1, seq, 128)
    assert_close(logits, ref[f"logits_{seq}"])


@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("name", ALL)
def test_matches_onnxruntime(name: str, seq: int) -> None:
    sess = ort_session(name)
    feeds = {"input_ids": reference(name)[f"input_ids_{seq}"]}
    (expected,) = sess.run(None, feeds)
    assert_close(run_ours(name, seq), expected)


@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("name", ALL)
def test_matches_saved_reference(name: str, seq: int) -> None:
    """Runs without onnxruntime: the quantized fixtures' saved ORT logits, the float ones' torch logits."""
    assert_close(run_ours(name, seq), reference(name)[f"logits_{seq}"])


def test_quantization_changes_the_logits() -> None:
    """The quantized fixtures are really quantized: their logits differ from the float model's."""
    base = reference("llama_dynamo")["logits_7"]
    for name in QDQ + NBITS + NBITS_GATHER:
        diff = np.abs(reference(name)["logits_7"] - base).max()
        assert 1e-3 < diff < 1.0, (name, diff)


def test_dynamic_sequence_prefix_is_causal() -> None:
    """With the causal mask, the first 7 positions of a longer run depend only on those 7 tokens."""
    ids = reference("llama_ts")["input_ids_12"]
    (short,) = ours("llama_ts").run(None, {"input_ids": ids[:, :7].copy()})
    (full,) = ours("llama_ts").run(None, {"input_ids": ids})
    np.testing.assert_allclose(short, full[:, :7], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ALL)
def test_fixture_loads_metadata_only(name: str) -> None:
    path = model_path(name)
    loaded = load_model(path)
    proto = onnx.load(path, load_external_data=False)
    data_file = os.path.realpath(os.path.join(FIXTURES, name, "model.onnx.data"))
    stored_external = {t.name for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    described_external = {n for n, w in loaded.weights.items() if w.is_external}
    assert described_external == stored_external
    # Every 2-D tensor (weights, packed 4-bit blobs, block scales) is external; only scalars and shape constants stay.
    assert {t.name for t in proto.graph.initializer if len(t.dims) >= 2} <= described_external
    spans = sorted((w.payload.offset, w.payload.offset + w.payload.length) for w in loaded.weights.values()
                   if w.is_external)
    for w in loaded.weights.values():
        if w.is_external:
            assert w.payload.file == data_file
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans)), "payloads overlap"
    assert spans[-1][1] <= os.path.getsize(data_file)


def test_qdq_fixture_describes_packed_int4() -> None:
    loaded = load_model(model_path("llama_qdq_int4"))
    four_bit = [w for w in loaded.weights.values() if w.elem_type in (TensorProto.INT4, TensorProto.UINT4)]
    kinds = {w.elem_type for w in four_bit}
    assert kinds == {TensorProto.INT4, TensorProto.UINT4}
    # 15 MatMul weights (7 per layer + lm_head), the embedding table, zero points of the 7 odd MatMuls
    assert len(four_bit) == 15 + 1 + 7
    for w in four_bit:
        assert w.is_external
        assert w.payload.length == (w.numel + 1) // 2
    dq = [n for n in loaded.graph.node if n.op_type == "DequantizeLinear"]
    assert {a.i for n in dq for a in n.attribute if a.name == "block_size"} == {32}
    assert loaded.opsets[""] == 21
