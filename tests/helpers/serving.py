"""The serving tests' model and their replica processes (importable by spawned children).

``small_llm`` writes a tiny-llm genai folder (2 blocks, vocab 256) with a word-level ``tokenizer.json``
("<5> <17>" <-> [5, 17]) when ``tokenizers`` is installed. ``replica_process`` is one replica in its own
process: it waits at a barrier so every replica starts at once, serves one request, and reports its
outputs and what its session prepacked or read from the shared cache.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np

from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm, prefill_feeds

SMALL = TinyLlmConfig(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256, context_length=64)
PROMPT = [5, 17, 42, 7]
GATE_LIMIT = 60.0  # seconds: a bound on waiting for a gate, never a synchronization delay


def small_llm(folder: str | os.PathLike, *, tokenizer: bool = True) -> str:
    """The tiny-llm genai folder (returns the folder; the model is ``<folder>/tiny-llm.onnx``)."""
    path = generate_tiny_llm(folder, config=SMALL)
    if tokenizer:
        try:
            import tokenizers
        except ImportError:
            return os.path.dirname(path)
        vocab = {f"<{i}>": i for i in range(1, SMALL.vocab)} | {"<unk>": 0}
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
        tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
        tok.save(os.path.join(os.path.dirname(path), "tokenizer.json"))
    return os.path.dirname(path)


def model_file(folder: str | os.PathLike) -> str:
    return os.path.join(os.fspath(folder), "tiny-llm.onnx")


def feeds(tokens: list[int] = PROMPT) -> dict[str, np.ndarray]:
    return prefill_feeds(SMALL, tokens)


def direct_outputs(model: str, tokens: list[int] = PROMPT) -> dict[str, np.ndarray]:
    """A session with no cache at all: what every replica must answer."""
    from onnx_prepared.runtime import RuntimeSession

    with RuntimeSession(model) as s:
        names = [o.name for o in s.parts.loaded.graph.output]
        return dict(zip(names, s.run(feeds(tokens))))


def ort_outputs(model: str, tokens: list[int] = PROMPT) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds(tokens))))


def prepack_counts(session: Any) -> tuple[int, int]:
    """(objects this session prepacked, objects it read packed from the companion)."""
    c = session.state.counters
    return (sum(v for k, v in c.items() if k.startswith("prepack:")),
            sum(v for k, v in c.items() if k.startswith("read_packed:")))


def replica_process(model: str, cache: str, barrier: Any, results: Any, tag: str, locking: bool,
                    hold: Any = None) -> None:
    """One replica process: barrier, then open, serve one request, wait for preparation and its flush.

    ``hold`` (reached, go): the replica's flush stops after its payloads are written, before it takes
    the exclusive lock, until ``go`` is set (another replica must not need it to go on).
    """
    os.environ["ONNX_PREPARED_CACHE_LOCKING"] = "1" if locking else "0"
    try:
        if hold is not None:
            from onnx_prepared.prepared import cache_io

            reached, go = hold

            def checkpoint(stage: str) -> None:
                if stage == "data_written":
                    reached.set()
                    if not go.wait(GATE_LIMIT):
                        raise RuntimeError("gate never opened")

            cache_io.checkpoint = checkpoint
        from onnx_prepared.serve.replica import ModelReplica

        if barrier is not None:
            barrier.wait(GATE_LIMIT)
        replica = ModelReplica(model, cache, {"intra_op_num_threads": 1})
        out = asyncio.run(replica.infer(feeds()))
        if not replica.wait_prepared(GATE_LIMIT):
            raise RuntimeError("preparation never ended")
        prepacked, hits = prepack_counts(replica.session)
        locked = replica.session.companion.locking
        replica.close()
        results.put((tag, {"outputs": out, "prepacked": prepacked, "hits": hits, "locking": locked}))
    except BaseException as e:  # the parent reports it
        results.put((tag, {"error": f"{type(e).__name__}: {e}"}))
