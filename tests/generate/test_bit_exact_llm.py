"""The whole generated INT4 LLM bit for bit against onnxruntime: prefill, then decode steps on
onnxruntime's KV cache, at accuracy_level 4 (int8 activations; the tied INT4 embedding) and 0 (fp32; the
untied genai shape). Every op on the path reproduces onnxruntime's roundings at our default dispatch level
on a CPU where onnxruntime runs its AVX-512 kernels (MatMulNBits, GroupQueryAttention, Sigmoid, the
norms, GatherBlockQuantized); elsewhere the issue's tolerance (atol 1e-4 + rtol 1e-3) applies. Not yet
bit-equal: MatMulNBits at accuracy_level 0 with one row (a decode step), up to ~2e-7 apart, so level 0's
decode steps are held to the tolerance.
onnxruntime runs on one thread (with more it may split a decode's keys over threads, which rounds
otherwise)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnx_prepared.generate import decode_feeds, generate_tiny_llm, prefill_feeds
from onnx_prepared.kernels import native
from onnx_prepared.runtime import RuntimeSession
from tests.generate.conftest import SMALL

ort = pytest.importorskip("onnxruntime")

EXACT = native.dispatch_level() == "avx512vnni"


@pytest.mark.parametrize("config", [SMALL, dataclasses.replace(SMALL, embedding="fp32", accuracy_level=0)],
                         ids=["tied-level4", "untied-level0"])
def test_prefill_and_decode_match_onnxruntime(config, tmp_path):
    path = generate_tiny_llm(tmp_path, config=config)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feeds = prefill_feeds(config, np.random.default_rng(4).integers(0, config.vocab, 11))
    with RuntimeSession(path) as ours:
        for step in range(4):  # prefill, then three decode steps
            expected = dict(zip(names, sess.run(None, feeds)))
            actual = dict(zip(names, ours.run(feeds)))
            for k in names:
                if EXACT and (config.accuracy_level == 4 or step == 0):
                    assert np.array_equal(actual[k], expected[k]), (k, float(np.abs(actual[k] - expected[k]).max()))
                else:
                    np.testing.assert_allclose(actual[k], expected[k], atol=1e-4, rtol=1e-3, err_msg=k)
            feeds = decode_feeds(config, int(expected["logits"][0, -1].argmax()), expected)
    assert np.std(expected["logits"]) > 0.05
