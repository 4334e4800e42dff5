"""``embedding="fp32"``: onnxruntime-genai's builder default, an untied float32 embedding table (plain Gather)
and a separate INT4 LM head. The files are consistent, onnxruntime runs them, and we match onnxruntime."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import pytest

from onnx_prepared.generate import DATA_FILE, TinyLlmConfig, decode_feeds, generate_tiny_llm, prefill_feeds
from onnx_prepared.generate.tiny_llm import EMBED_TABLE, weight_names
from onnx_prepared.runtime import RuntimeSession
from tests.generate.conftest import SMALL

UNTIED = dataclasses.replace(SMALL, embedding="fp32", accuracy_level=0)


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> str:
    return generate_tiny_llm(tmp_path_factory.mktemp("untied"), config=UNTIED)


def test_layout_and_sizes(untied):
    m = onnx.load(untied, load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    assert "GatherBlockQuantized" not in ops
    (emb,) = [n for n in m.graph.node if n.name == "/model/embed_tokens/Gather"]
    assert list(emb.input) == [EMBED_TABLE, "input_ids"]
    inits = {t.name: t for t in m.graph.initializer}
    assert inits[EMBED_TABLE].data_type == onnx.TensorProto.FLOAT
    assert list(inits[EMBED_TABLE].dims) == [UNTIED.vocab, UNTIED.hidden]
    (head,) = [n for n in m.graph.node if n.name == "/lm_head/MatMulNBits"]
    assert list(head.input[1:]) == list(weight_names(UNTIED, "lm_head")) and head.output[0] == "logits"
    assert UNTIED.num_parameters == SMALL.num_parameters + UNTIED.vocab * UNTIED.hidden
    assert UNTIED.int4_bytes == SMALL.int4_bytes
    data = os.path.getsize(os.path.join(os.path.dirname(untied), DATA_FILE))
    assert UNTIED.payload_bytes <= data < UNTIED.payload_bytes + 4096 * len(inits)
    assert TinyLlmConfig.from_model(untied) == UNTIED


def test_tied_config_json_has_no_embedding_field():
    assert "embedding" not in SMALL.to_json() and '"embedding": "fp32"' in UNTIED.to_json()
    assert TinyLlmConfig.from_json(SMALL.to_json()) == SMALL
    with pytest.raises(ValueError, match="embedding"):
        dataclasses.replace(SMALL, embedding="int8")


def test_matches_onnxruntime_prefill_and_decode(untied):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(untied, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    toks = np.random.default_rng(3).integers(0, UNTIED.vocab, 9)
    feeds = prefill_feeds(UNTIED, toks)
    with RuntimeSession(untied) as ours:
        for _ in range(3):  # prefill, then two decode steps on onnxruntime's KV cache
            expected = dict(zip(names, sess.run(None, feeds)))
            actual = dict(zip(names, ours.run(feeds)))
            for k in names:
                np.testing.assert_allclose(actual[k], expected[k], atol=1e-4, rtol=1e-3, err_msg=k)
            feeds = decode_feeds(UNTIED, int(expected["logits"][0, -1].argmax()), expected)
    assert np.std(expected["logits"]) > 0.05
