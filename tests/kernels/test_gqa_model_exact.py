"""A whole INT4 LLM at accuracy_level 4 with a 128-token prompt against onnxruntime: its GroupQueryAttention
in the CPU's softmax order keeps the logits within atol 1e-4 + rtol 1e-3 (bit-equal on the machines this
was measured on), where one ulp in an attention output flips int8 roundings of the next MatMulNBits and
deep layers amplify it. The same model with the other order, forced, does not reach onnxruntime's bits.

A small model of the medium preset's head shape (head size 64, grouped KV heads), so that the key blocks
and exp sums are those of real prompts; generated once per module (about 3 s)."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared import InferenceSession
from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm, prefill_feeds
from onnx_prepared.kernels import attention, native

ort = pytest.importorskip("onnxruntime")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not native.available(), reason="native extension not built")]

ATOL, RTOL = 1e-4, 1e-3
SHAPE = dict(preset="medium", layers=3, hidden=256, intermediate=512, heads=4, kv_heads=2, vocab=1024,
             context_length=256, accuracy_level=4)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = generate_tiny_llm(tmp_path_factory.mktemp("gqa-model") / "m", **SHAPE)
    config = TinyLlmConfig.from_model(path)
    ids = np.random.default_rng(0).integers(0, config.vocab, (1, 128), dtype=np.int64)
    feeds = prefill_feeds(config, ids)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    return path, feeds, want


def _logits(monkeypatch, model, order: str | None) -> np.ndarray:
    path, feeds, _ = model
    if order is None:
        monkeypatch.delenv(attention.ORDER_ENV, raising=False)
    else:
        monkeypatch.setenv(attention.ORDER_ENV, order)
    attention.gqa_order.cache_clear()
    try:
        return InferenceSession(path).run(["logits"], feeds)[0]
    finally:
        attention.gqa_order.cache_clear()


@pytest.mark.parametrize("level", native.supported_levels())
def test_prefill_128_logits_match_onnxruntime(monkeypatch, model, level):
    """At every dispatch level, portable included: each level's kernels keep onnxruntime's bits on this
    CPU (portable fuses the multiply-adds with fmaf where MLAS's kernels fuse them), or the int8
    roundings of the next MatMulNBits flip and deep layers amplify the ulps."""
    want = model[2]
    with native.forced_level(level):
        got = _logits(monkeypatch, model, None)
    d = np.abs(got.astype(np.float64) - want)
    outside = int((d > ATOL + RTOL * np.abs(want)).sum())
    assert outside == 0, (outside, float(d.max()))


def test_the_other_order_misses_onnxruntimes_bits(monkeypatch, model):
    own = _logits(monkeypatch, model, None)
    other = "avx512" if attention.gqa_order() == "avx2" else "avx2"
    assert not np.array_equal(_logits(monkeypatch, model, other), own)
