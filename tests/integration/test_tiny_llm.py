"""End to end: the generated tiny INT4 LLM (prefill, then decode with the KV cache) against onnxruntime.

Each side carries its own KV cache (``present.*`` -> ``past_key_values.*``); the tokens are onnxruntime's
greedy choices, fed to both sides (teacher forcing), so one near-tie argmax at accuracy level 4 cannot
derail the comparison. Models: ``small`` (2 layers, hidden 128, 4 heads, 2 KV heads, vocab 512) and the
spec's default ``tiny`` config (4 layers, hidden 512, vocab 8192; ~13 MB, generated in ~0.3 s).

Bounds: with ``accuracy_level=0`` onnxruntime computes MatMulNBits in fp32 like us, so logits and
present KV agree to ``ATOL`` (measured ~3e-6). At the default ``accuracy_level=4`` both sides quantize
activations to int8 per block the same way; each MatMulNBits fed onnxruntime's own input matches its output
to 7e-7 of max|y|, but an upstream difference of one ulp (GroupQueryAttention: 4.5e-7) can move an
activation across an int8 rounding boundary, and deeper models amplify that: ``small`` matches to
atol 1e-4 + rtol 1e-3 (measured 3e-7), ``tiny`` (4 layers, hidden 512) within ``LEVEL4_REL`` (measured
1.3% of max|logits|, from one flip in layer 0's o_proj input).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import onnx_prepared
from onnx_prepared.generate import TinyLlmConfig, decode_feeds, generate_tiny_llm, prefill_feeds
from onnx_prepared.runtime import RuntimeSession

ort = pytest.importorskip("onnxruntime")

ATOL = 1e-3
LEVEL4_REL = 0.02
PROMPT = 16
DECODE_STEPS = 4
CONFIGS = {
    "small": dict(layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512),
    "tiny": {},
}

Run = Callable[[dict], list]
Step = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Callable[[str, int], str]:
    cache: dict[tuple[str, int], str] = {}

    def get(name: str, accuracy_level: int) -> str:
        key = (name, accuracy_level)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{name}-acc{accuracy_level}")
            cache[key] = generate_tiny_llm(out, accuracy_level=accuracy_level, **CONFIGS[name])
        return cache[key]

    return get


def ort_run(path: str) -> Run:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def ours_inference(path: str) -> Run:
    sess = onnx_prepared.InferenceSession(path)
    return lambda feeds: sess.run(None, feeds)


def output_names(config: TinyLlmConfig) -> list[str]:
    return ["logits"] + [f"present.{i}.{kind}" for i in range(config.layers) for kind in ("key", "value")]


def rollout(run: Run, config: TinyLlmConfig, prompt: np.ndarray, tokens: list[np.ndarray] | None = None,
            steps: int = DECODE_STEPS) -> tuple[list[Step], list[np.ndarray]]:
    """Prefill over ``prompt`` then ``steps`` decode steps on this side's own KV cache.

    Returns each step's outputs by name and the tokens fed after each step: ``tokens[i]`` when given
    (teacher forcing), else this side's greedy argmax.
    """
    names = output_names(config)
    feeds = prefill_feeds(config, prompt)
    steps_out, fed = [], []
    for i in range(steps + 1):
        out = dict(zip(names, run(feeds)))
        steps_out.append(out)
        if i == steps:
            break
        nxt = tokens[i] if tokens is not None else out["logits"][:, -1].argmax(-1)
        fed.append(nxt)
        feeds = decode_feeds(config, nxt, out)
    return steps_out, fed


def prompt_tokens(config: TinyLlmConfig, batch: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocab, (batch, PROMPT), dtype=np.int64)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max())


def check_shapes(steps: list[Step], config: TinyLlmConfig, batch: int) -> None:
    for i, out in enumerate(steps):
        total = PROMPT + i
        assert out["logits"].shape == (batch, PROMPT if i == 0 else 1, config.vocab)
        assert out["logits"].dtype == np.float32
        for kind in ("key", "value"):
            assert out[f"present.0.{kind}"].shape == (batch, config.kv_heads, total, config.head_dim)


# **** ours vs onnxruntime ****


@pytest.mark.parametrize("name", ["small", "tiny"])
def test_prefill_and_decode_match_onnxruntime_exact_level(model, name: str) -> None:
    """accuracy_level=0: logits and every present KV within ATOL at every step; same greedy tokens."""
    path = model(name, 0)
    config = TinyLlmConfig.from_model(path)
    prompt = prompt_tokens(config)
    expected, tokens = rollout(ort_run(path), config, prompt)
    with RuntimeSession(path) as sess:
        actual, our_tokens = rollout(sess.run, config, prompt)
    check_shapes(actual, config, 1)
    assert [t.tolist() for t in our_tokens] == [t.tolist() for t in tokens]
    for i, (a, e) in enumerate(zip(actual, expected)):
        for k in e:
            np.testing.assert_allclose(a[k], e[k], atol=ATOL, rtol=0, err_msg=f"step {i} {k}")
    # the prompt really matters: logits are far from constant and K/V grow by one position per step
    assert np.ptp(expected[0]["logits"]) > 0.1


@pytest.mark.parametrize("name", ["small", "tiny"])
def test_default_accuracy_level_4_matches_onnxruntime(model, name: str) -> None:
    """accuracy_level=4 (the generator's default): both sides quantize activations to int8 per block alike."""
    path = model(name, 4)
    config = TinyLlmConfig.from_model(path)
    assert config.accuracy_level == 4
    prompt = prompt_tokens(config)
    expected, tokens = rollout(ort_run(path), config, prompt)
    with RuntimeSession(path) as sess:
        actual, _ = rollout(sess.run, config, prompt, tokens)
    for i, (a, e) in enumerate(zip(actual, expected)):
        for k in e:
            if name == "small":
                np.testing.assert_allclose(a[k], e[k], atol=1e-4, rtol=1e-3, err_msg=f"step {i} {k}")
            else:
                rel = max_diff(a[k], e[k]) / float(np.abs(e[k]).max())
                assert rel <= LEVEL4_REL, f"step {i} {k}: max|ours - ort| is {rel:.2%} of max|ort|"



@pytest.mark.parametrize("level", [0, 4])
def test_level4_gap_is_onnxruntimes_own_one_ulp_sensitivity(model, level: int) -> None:
    """Why LEVEL4_REL is the honest bound: a 1-ulp change of a decode step's float inputs (the KV cache)
    moves onnxruntime's own level-4 logits by the same order as our difference from it whenever an activation
    crosses an int8 rounding boundary (here at decode steps 2 and 3: 0.85% and 1.1%); at level 0 the same
    change stays at fp32 rounding. (On the medium preset after 128 tokens: onnxruntime vs itself 1.0-1.5% of
    max|logits|, ours vs onnxruntime 1.0-1.4%; level 0 8e-7-1e-6.)"""
    path = model("tiny", level)
    config = TinyLlmConfig.from_model(path)
    run = ort_run(path)
    steps, tokens = rollout(run, config, prompt_tokens(config))
    worst = 0.0
    for prev, tok in zip(steps, tokens):
        feeds = decode_feeds(config, tok, prev)
        nudged = {k: np.nextafter(v, np.float32(np.inf)) if v.dtype == np.float32 else v for k, v in feeds.items()}
        base = run(feeds)[0]
        worst = max(worst, max_diff(run(nudged)[0], base) / float(np.abs(base).max()))
    if level == 0:
        assert worst < 1e-5, worst
    else:
        assert 1e-3 < worst <= LEVEL4_REL, worst  # onnxruntime is not stable to one ulp of its own input

def test_batch_of_two_prompts(model) -> None:
    """Batch 2 through prefill and decode matches onnxruntime, and each row equals its batch-1 run."""
    path = model("small", 0)
    config = TinyLlmConfig.from_model(path)
    prompt = prompt_tokens(config, batch=2, seed=1)
    assert not np.array_equal(prompt[0], prompt[1])
    expected, tokens = rollout(ort_run(path), config, prompt)
    with RuntimeSession(path) as sess:
        actual, _ = rollout(sess.run, config, prompt, tokens)
        row1, _ = rollout(sess.run, config, prompt[1:], [t[1:] for t in tokens])
    check_shapes(actual, config, 2)
    for i, (a, e, r) in enumerate(zip(actual, expected, row1)):
        for k in e:
            np.testing.assert_allclose(a[k], e[k], atol=ATOL, rtol=0, err_msg=f"step {i} {k}")
            np.testing.assert_allclose(a[k][1:], r[k], atol=1e-5, rtol=0, err_msg=f"step {i} {k} row 1")
    assert not np.allclose(actual[0]["logits"][0], actual[0]["logits"][1], atol=1e-2)


# **** InferenceSession vs RuntimeSession (cold, then hot) ****


def test_inference_session_and_runtime_session_agree_bit_for_bit(model) -> None:
    path = model("small", 0)
    config = TinyLlmConfig.from_model(path)
    prompt = prompt_tokens(config, seed=2)
    reference, tokens = rollout(ours_inference(path), config, prompt)
    with RuntimeSession(path) as sess:
        first = sess.run(prefill_feeds(config, prompt))  # cold: weights are read during this run
        assert (sess.counters["cold_runs"], sess.counters["hot_runs"]) == (1, 0)
        sess.prepare()  # the prepacks a cold run starts when it ends (source forms): the rest is hot
        hot, _ = rollout(lambda f: sess.run_async(f).result(), config, prompt, tokens)
        assert sess.counters["cold_runs"] == 1 and sess.counters["hot_runs"] == DECODE_STEPS + 1
    names = output_names(config)
    for n, v in zip(names, first):
        np.testing.assert_array_equal(v, reference[0][n], err_msg=f"cold prefill {n}")
    for i, (h, r) in enumerate(zip(hot, reference)):
        for n in names:
            np.testing.assert_array_equal(h[n], r[n], err_msg=f"hot step {i} {n}")


def test_prepared_session_runs_hot_from_the_first_run(model) -> None:
    """After prepare(), the first run takes the hot path and gives the cold run's values."""
    path = model("small", 0)
    config = TinyLlmConfig.from_model(path)
    feeds = prefill_feeds(config, prompt_tokens(config, seed=3))
    with RuntimeSession(path) as cold:
        expected = cold.run(feeds)
    with RuntimeSession(path) as sess:
        sess.prepare()
        actual = sess.run(feeds)
        assert (sess.counters["cold_runs"], sess.counters["hot_runs"]) == (0, 1)
    for n, a, e in zip(output_names(config), actual, expected):
        np.testing.assert_array_equal(a, e, err_msg=n)
