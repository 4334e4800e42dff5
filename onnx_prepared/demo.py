"""``onnx-prepared demo``: the spec's tiny INT4 LLM, generated into a cache folder once, then prefill + greedy decode.

What it prints, for ours (:class:`~onnx_prepared.runtime.RuntimeSession`, the prepared runtime) and, when
installed, onnxruntime on the same feeds:

* **time to first output**: from session creation (model load, weight reads, prepacking) to the prefill's
  logits. Ours overlaps weight reads and prepacks with the prefill itself (the cold path); onnxruntime
  loads and prepacks everything in its constructor, then runs the prefill.
* **decode tokens/s**: greedy steps with the KV cache (one token each, present -> past), after the prefill.
* whether the greedy tokens of both runtimes match.

The model is generated once; a different model already in the folder is never overwritten (see
:func:`ensure_model`).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

PROMPT_TOKENS = 16
DECODE_STEPS = 32


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnx-prepared")


DEMO_SUBFOLDER = "onnx-prepared-demo"


def ensure_model(folder: str, *, owned: bool = False) -> tuple[str, float | None]:
    """The tiny-llm in ``folder`` (generated if absent); returns (path, generation seconds or None).

    A model already in ``folder`` is reused only when it is the demo's own (same generator config); any other
    model, or a stray data or config file of the same name, is never overwritten: the demo then uses the
    subfolder ``onnx-prepared-demo``, and refuses with a ModelLoadError if that is occupied too. ``owned``
    (the default per-user cache folder) regenerates a stale model in place instead.
    """
    from onnx_prepared.errors import ModelLoadError

    for candidate in (folder, os.path.join(folder, DEMO_SUBFOLDER)):
        state, path = _folder_state(candidate)
        if state == "ours":
            return path, None
        if state == "empty" or (owned and candidate == folder):
            if candidate != folder:
                print(f"note: {folder} holds another model; the demo model goes to {candidate}")
            t0 = time.perf_counter()
            path = _generate(candidate)
            return path, time.perf_counter() - t0
    raise ModelLoadError(f"{folder} and {os.path.join(folder, DEMO_SUBFOLDER)} both hold models the demo did not "
                         "generate; pass --dir with an empty folder")


def _folder_state(folder: str) -> tuple[str, str]:
    """("ours" | "empty" | "foreign", model path): whether the demo may use ``folder``."""
    from onnx_prepared.generate import DATA_FILE, MODEL_FILE, TinyLlmConfig

    path = os.path.join(folder, MODEL_FILE)
    if os.path.exists(path):
        try:
            same = TinyLlmConfig.from_model(path).to_json() == TinyLlmConfig().to_json()
        except (ValueError, OSError):
            same = False  # unreadable or not written by our generator
        return ("ours" if same else "foreign"), path
    taken = any(os.path.exists(os.path.join(folder, f)) for f in (DATA_FILE, "genai_config.json"))
    return ("foreign" if taken else "empty"), path


def _generate(folder: str) -> str:
    from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm

    return generate_tiny_llm(folder, config=TinyLlmConfig())


@dataclass(frozen=True, slots=True)
class GreedyRun:
    """One runtime's figures: seconds to first logits (from session creation), decode seconds, tokens."""

    name: str
    first_output_s: float
    prefill_s: float
    decode_s: float
    tokens: list[int]

    @property
    def tokens_per_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else float("inf")


def greedy(name: str, open_session: Callable[[], Callable[[dict], list]], output_names: list[str], config,
           prompt: np.ndarray, steps: int) -> GreedyRun:
    """Create a session, prefill ``prompt``, then ``steps`` greedy decode steps with the KV cache.

    ``tokens`` holds the prefill's argmax then one per decode step; decode time covers the ``steps`` runs.
    """
    from onnx_prepared.generate import decode_feeds, prefill_feeds

    t0 = time.perf_counter()
    run = open_session()
    t1 = time.perf_counter()
    out = dict(zip(output_names, run(prefill_feeds(config, prompt))))
    t2 = time.perf_counter()
    tokens = [int(out["logits"][0, -1].argmax())]
    t_decode = time.perf_counter()
    for _ in range(steps):
        out = dict(zip(output_names, run(decode_feeds(config, tokens[-1], out))))
        tokens.append(int(out["logits"][0, -1].argmax()))
    t3 = time.perf_counter()
    return GreedyRun(name, t2 - t0, t2 - t1, t3 - t_decode, tokens)


def _ours(path: str, session: str) -> Callable[[], Callable[[dict], list]]:
    def open_session():
        if session == "inference":
            from onnx_prepared import InferenceSession

            sess = InferenceSession(path)
            return lambda feeds: sess.run(None, feeds)
        from onnx_prepared.runtime import RuntimeSession

        return RuntimeSession(path).run

    return open_session


def _onnxruntime(path: str) -> Callable[[], Callable[[dict], list]] | None:
    """onnxruntime's session opener, or None when it is not installed.

    onnxruntime is imported inside the timed opener, as our runtime modules are (they load lazily on the
    first session), so both columns count each runtime's own import the same way.
    """
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return None

    def open_session():
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return lambda feeds: sess.run(None, feeds)

    return open_session


def run_demo(args: argparse.Namespace) -> int:
    from onnx_prepared.generate import TinyLlmConfig

    folder = getattr(args, "dir", None) or os.path.join(default_cache_dir(), "tiny-llm")
    owned = getattr(args, "dir", None) is None
    steps = getattr(args, "steps", None)
    steps = DECODE_STEPS if steps is None else int(steps)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    session = getattr(args, "session", None) or "runtime"
    path, gen_s = ensure_model(folder, owned=owned)
    config = TinyLlmConfig.from_model(path)
    print(f"model: {path}" + (f" (generated in {gen_s:.2f} s)" if gen_s is not None else " (cached)"))
    print(f"tiny-llm: {config.layers} blocks, hidden {config.hidden}, vocab {config.vocab}, INT4 block "
          f"{config.block_size}, MatMulNBits accuracy_level {config.accuracy_level}; prompt {PROMPT_TOKENS} "
          f"tokens, {steps} greedy decode steps with the KV cache")
    from onnx_prepared.kernels import native

    print(native.describe())
    names = ["logits"] + [f"present.{i}.{k}" for i in range(config.layers) for k in ("key", "value")]
    prompt = np.random.default_rng(0).integers(0, config.vocab, PROMPT_TOKENS, dtype=np.int64)

    label = "RuntimeSession" if session == "runtime" else "InferenceSession"
    runs = [greedy(f"ours ({label})", _ours(path, session), names, config, prompt, steps)]
    ort_open = _onnxruntime(path)
    if ort_open is not None:
        runs.append(greedy("onnxruntime", ort_open, names, config, prompt, steps))

    print()
    print(f"{'':26} {'time to first output':>21} {'of which prefill':>17} {'decode tokens/s':>16}")
    for r in runs:
        rate = f"{r.tokens_per_s:>16.1f}" if steps else f"{'-':>16}"
        print(f"{r.name:26} {r.first_output_s * 1e3:>18.1f} ms {r.prefill_s * 1e3:>14.1f} ms {rate}")
    print("time to first output: the runtime's own import + session creation (load, weight reads, prepack) + "
          "prefill, until the logits (numpy is loaded for both); decode: tokens/s over the decode steps only")
    print(f"greedy tokens (ours): {runs[0].tokens}")
    if len(runs) > 1:
        same = runs[0].tokens == runs[1].tokens
        print(f"greedy tokens match onnxruntime: {'yes' if same else 'NO'}")
        if not same:
            print(f"greedy tokens (onnxruntime): {runs[1].tokens}")
        if config.accuracy_level == 4:
            print("(accuracy_level 4: both sides quantize activations to int8; a one-ulp difference upstream can "
                  "flip an int8 rounding, so near-tie argmaxes may differ)")
    else:
        print("onnxruntime is not installed: no comparison")
    return 0
