"""A session's first (cold) run and its later (hot) runs give bit-identical outputs.

No kernel changes between them: the cold path and the hot path call the same kernels on the same prepared
objects, and no accelerator is swapped in in the background. Checked on the spec's tiny-llm (generated) and
on onnxruntime-genai builder models with MatMulNBits (``tests/fixtures/genai_int4*``), for a prefill and a
KV-cache decode step, each run cold in a fresh session and hot after ``prepare()``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

from onnx_prepared.generate import TinyLlmConfig, decode_feeds, generate_tiny_llm, prefill_feeds
from onnx_prepared.runtime import RuntimeSession

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
PROMPT = 12


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory) -> str:
    return generate_tiny_llm(tmp_path_factory.mktemp("tiny-llm"))


def _feeds(path: str) -> tuple[dict, dict]:
    """Prefill feeds and the decode feeds that follow them (past = the prefill's presents)."""
    config = TinyLlmConfig.from_model(path)
    ids = np.random.default_rng(1).integers(0, config.vocab, PROMPT, dtype=np.int64)
    pre = prefill_feeds(config, ids)
    with RuntimeSession(path) as s:
        out = dict(zip(_output_names(path), s.run(pre)))
    return pre, decode_feeds(config, int(out["logits"][0, -1].argmax()), out)


def _output_names(path: str) -> list[str]:
    return [o.name for o in onnx.load(path, load_external_data=False).graph.output]


def _cold_then_hot(path: str, feeds: dict) -> tuple[list, list[list]]:
    with RuntimeSession(path) as s:
        cold = s.run(feeds)
        assert s.counters["cold_runs"] == 1 and s.counters["hot_runs"] == 0
        s.prepare()
        hot = [s.run(feeds) for _ in range(2)]
        assert s.counters["hot_runs"] == 2
    return cold, hot


def _assert_identical(cold: list, hot: list[list]) -> None:
    for run in hot:
        assert len(run) == len(cold)
        for i, (c, h) in enumerate(zip(cold, run)):
            assert c.dtype == h.dtype and c.shape == h.shape, i
            assert np.array_equal(c, h), f"output {i}: max |cold - hot| = {np.abs(c - h).max()}"


def test_tiny_llm_prefill_and_decode_cold_equals_hot(tiny_llm):
    pre, dec = _feeds(tiny_llm)
    for feeds in (pre, dec):
        _assert_identical(*_cold_then_hot(tiny_llm, feeds))


@pytest.mark.parametrize("name", ["genai_int4", "genai_int4_qwen_asym"])
def test_genai_matmul_nbits_model_cold_equals_hot(name):
    path = os.path.join(FIXTURES, name, "model.onnx")
    with open(os.path.join(FIXTURES, name, "genai_config.json")) as f:
        d = json.load(f)["model"]["decoder"]
    ids = np.random.default_rng(2).integers(0, 256, (1, PROMPT), dtype=np.int64)
    past = np.zeros((1, d["num_key_value_heads"], 0, d["head_size"]), np.float32)
    pre = {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64)}
    for i in range(d["num_hidden_layers"]):
        pre[f"past_key_values.{i}.key"] = pre[f"past_key_values.{i}.value"] = past
    cold, hot = _cold_then_hot(path, pre)
    _assert_identical(cold, hot)
    # a decode step after the prefill, cold in a fresh session and hot after prepare()
    out = dict(zip(_output_names(path), cold))
    dec = {"input_ids": np.asarray([[int(out["logits"][0, -1].argmax())]], np.int64),
           "attention_mask": np.ones((1, PROMPT + 1), np.int64)}
    for i in range(d["num_hidden_layers"]):
        for kind in ("key", "value"):
            dec[f"past_key_values.{i}.{kind}"] = out[f"present.{i}.{kind}"]
    _assert_identical(*_cold_then_hot(path, dec))


def test_results_do_not_depend_on_intra_op_threads(tiny_llm):
    """Kernels split over output rows/columns only: 1 and 2 intra-op threads give the same bits."""
    pre, dec = _feeds(tiny_llm)
    outs = []
    for n in (1, 2):
        with RuntimeSession(tiny_llm, {"intra_op_num_threads": n}) as s:
            s.prepare()
            outs.append([s.run(pre), s.run(dec)])
    for a, b in zip(outs[0], outs[1]):
        _assert_identical(a, [b])
