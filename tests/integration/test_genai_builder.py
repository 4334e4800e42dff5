"""End to end: models exported by onnxruntime-genai's builder, prefill then KV-cache decode, vs onnxruntime.

Fixtures (``tests/fixtures/make_genai.py``; tiny random Llama / Qwen2 decoders, hidden 64, 2 layers, vocab 256):
``genai_fp32`` (MatMul), ``genai_int4`` (symmetric MatMulNBits, accuracy_level 4) and ``genai_int4_qwen_asym``
(asymmetric MatMulNBits with zero points, tied GatherBlockQuantized embedding, q/k/v bias Add).

Bounds: against onnxruntime on the models as built (INT4 at accuracy_level 4: both sides quantize activations
to int8 per block the same way) logits and present KV agree to ``ATOL``. Against onnxruntime computing in
fp32 (every MatMulNBits switched to ``accuracy_level=0``) the INT4 models differ by the int8 quantization
error, at most ``LEVEL4_REL`` x max|ort| (measured 0.95% and 0.73%).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable

import numpy as np
import onnx
import pytest

import onnx_prepared
from onnx_prepared.runtime import RuntimeSession

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
ALL = ("genai_fp32", "genai_int4", "genai_int4_qwen_asym")
INT4 = ALL[1:]
ATOL = 1e-4
LEVEL4_REL = 0.02

Run = Callable[[dict], list]


def model_path(name: str) -> str:
    return os.path.join(FIXTURES, name, "model.onnx")


@functools.cache
def decoder(name: str) -> dict:
    with open(os.path.join(FIXTURES, name, "genai_config.json")) as f:
        return json.load(f)["model"]["decoder"]


@functools.cache
def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(FIXTURES, name, "reference.npz")) as z:
        return {k: z[k] for k in z.files}


@functools.cache
def output_names(name: str) -> list[str]:
    """Graph output order (genai writes every present key before the values; sessions return this order)."""
    return [o.name for o in onnx.load(model_path(name), load_external_data=False).graph.output]


def prefill(name: str, ids: np.ndarray) -> dict[str, np.ndarray]:
    d = decoder(name)
    past = np.zeros((ids.shape[0], d["num_key_value_heads"], 0, d["head_size"]), np.float32)
    feeds = {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64)}
    for i in range(d["num_hidden_layers"]):
        feeds[f"past_key_values.{i}.key"] = feeds[f"past_key_values.{i}.value"] = past
    return feeds


def decode(name: str, token: np.ndarray, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids = np.asarray(token, np.int64).reshape(-1, 1)
    total = out["present.0.key"].shape[2] + 1
    feeds = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], total), np.int64)}
    for i in range(decoder(name)["num_hidden_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = out[f"present.{i}.{kind}"]
    return feeds


def rollout(run: Run, name: str, ids: np.ndarray, tokens: list | None = None,
            steps: int = 3) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """Prefill over ``ids`` then ``steps`` decode steps on this side's own KV cache; each step's outputs by
    name and the tokens fed (``tokens[i]`` when given, else this side's greedy argmax)."""
    names = output_names(name)
    feeds, outs, fed = prefill(name, ids), [], []
    for i in range(steps + 1):
        out = dict(zip(names, run(feeds)))
        outs.append(out)
        if i == steps:
            break
        fed.append(np.asarray(tokens[i]) if tokens is not None else out["logits"][:, -1].argmax(-1))
        feeds = decode(name, fed[-1], out)
    return outs, fed


def ort_run(name: str, *, exact: bool) -> Run:
    """onnxruntime over the fixture; ``exact`` switches every MatMulNBits to accuracy_level 0 (fp32 math)."""
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    source: str | bytes = model_path(name)
    if exact:
        model = onnx.load(model_path(name))  # with its external data: the copy is serialized in memory
        for node in model.graph.node:
            for a in node.attribute:
                if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                    a.i = 0
        source = model.SerializeToString()
    sess = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def rel_diff(a: np.ndarray, e: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - e).max() / np.abs(e).max())


def prompt(name: str, batch: int = 1) -> np.ndarray:
    ids = reference(name)["input_ids"]
    return ids if batch == 1 else np.concatenate([ids, ids[:, ::-1]], axis=0)


# **** ours vs onnxruntime ****


@pytest.mark.parametrize("name", ALL)
def test_prefill_and_decode_match_onnxruntime(name: str) -> None:
    expected, tokens = rollout(ort_run(name, exact=False), name, prompt(name))
    with RuntimeSession(model_path(name)) as sess:
        actual, ours_tokens = rollout(sess.run, name, prompt(name))
    assert [int(t[0]) for t in ours_tokens] == [int(t[0]) for t in tokens]
    d = decoder(name)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a["logits"].shape == (1, prompt(name).shape[1] if i == 0 else 1, 256)
        assert a["present.1.value"].shape == (1, d["num_key_value_heads"], prompt(name).shape[1] + i, d["head_size"])
        for k in e:
            np.testing.assert_allclose(a[k], e[k], atol=ATOL, rtol=0, err_msg=f"step {i} {k}")


@pytest.mark.parametrize("name", INT4)
def test_int4_level4_really_quantizes_activations(name: str) -> None:
    """The builder's CPU default accuracy_level=4 is int8-activation math: away from fp32 by its quantization error."""
    expected, tokens = rollout(ort_run(name, exact=True), name, prompt(name))
    with RuntimeSession(model_path(name)) as sess:
        actual, _ = rollout(sess.run, name, prompt(name), tokens)
    rels = [rel_diff(a[k], e[k]) for a, e in zip(actual, expected) for k in e]
    assert max(rels) <= LEVEL4_REL, max(rels)
    assert max(rels) > 1e-5  # we really took the int8 path


@pytest.mark.parametrize("name", ALL)
def test_batch_of_two_prompts(name: str) -> None:
    ids = prompt(name, batch=2)
    expected, tokens = rollout(ort_run(name, exact=False), name, ids, steps=2)
    with RuntimeSession(model_path(name)) as sess:
        actual, _ = rollout(sess.run, name, ids, tokens, steps=2)
    rtol = 0 if name == "genai_fp32" else 1e-3  # int8 rounding-boundary flips (see tests/integration/test_tiny_llm.py)
    for i, (a, e) in enumerate(zip(actual, expected)):
        for k in e:
            np.testing.assert_allclose(a[k], e[k], atol=ATOL, rtol=rtol, err_msg=f"step {i} {k}")
    assert not np.allclose(actual[0]["logits"][0, -1], actual[0]["logits"][1, -1], atol=1e-3)


# **** saved references (no onnxruntime needed) ****


@pytest.mark.parametrize("name", ALL)
def test_matches_saved_onnxruntime_logits(name: str) -> None:
    """Teacher-forced with the saved tokens; fp32 to ATOL, INT4 (saved at level 4) to atol 1e-4 + rtol 1e-3."""
    ref = reference(name)
    with RuntimeSession(model_path(name)) as sess:
        actual, _ = rollout(sess.run, name, ref["input_ids"], list(ref["tokens"]))
    for i, a in enumerate(actual):
        expected = ref[f"logits_{i}"]
        if name == "genai_fp32":
            np.testing.assert_allclose(a["logits"], expected, atol=ATOL, rtol=0, err_msg=f"step {i}")
        else:
            np.testing.assert_allclose(a["logits"], expected, atol=ATOL, rtol=1e-3, err_msg=f"step {i}")


def test_fp32_export_matches_transformers() -> None:
    """The builder's fp32 graph run by us reproduces transformers' own forward pass, step by step."""
    ref = reference("genai_fp32")
    torch_logits = ref["torch_logits"]  # prompt + tokens in one pass: [1, PROMPT + steps, vocab]
    n = ref["input_ids"].shape[1]
    with RuntimeSession(model_path("genai_fp32")) as sess:
        actual, _ = rollout(sess.run, "genai_fp32", ref["input_ids"], list(ref["tokens"]))
    np.testing.assert_allclose(actual[0]["logits"], torch_logits[:, :n], atol=ATOL, rtol=0)
    for i, a in enumerate(actual[1:], start=1):
        np.testing.assert_allclose(a["logits"][:, 0], torch_logits[:, n + i - 1], atol=ATOL, rtol=0, err_msg=str(i))


# **** both session types ****


@pytest.mark.parametrize("name", ALL)
def test_inference_session_and_runtime_session_agree_bit_for_bit(name: str) -> None:
    sess = onnx_prepared.InferenceSession(model_path(name))
    expected, tokens = rollout(lambda f: sess.run(None, f), name, prompt(name))
    with RuntimeSession(model_path(name)) as rs:
        def run(feeds):
            out = rs.run(feeds)
            if rs.counters["cold_runs"] == 1 and not rs.counters["hot_runs"]:
                rs.prepare()  # the prepacks the cold run left for its end (source forms): the rest is hot
            return out

        actual, _ = rollout(run, name, prompt(name), tokens)  # first run cold, the rest hot
        assert (rs.counters["cold_runs"], rs.counters["hot_runs"]) == (1, 3)
    for i, (a, e) in enumerate(zip(actual, expected)):
        for k in e:
            np.testing.assert_array_equal(a[k], e[k], err_msg=f"step {i} {k}")
