"""genai-style feeds for the tiny LLM: prefill with an empty KV-cache, then one token at a time.

The caller owns the KV-cache: each run returns ``present.{i}.key/value`` [batch, kv_heads, total, head_dim]
and the next run binds them as ``past_key_values.{i}.key/value``. ``attention_mask`` covers past + new
tokens; the graph derives GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length`` from it.

>>> feeds = prefill_feeds(config, [1, 2, 3])                           # doctest: +SKIP
>>> out = dict(zip(names, sess.run(names, feeds)))                     # doctest: +SKIP
>>> feeds = decode_feeds(config, int(out["logits"][0, -1].argmax()), out)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from onnx_prepared.generate.config import TinyLlmConfig


def _as_batch(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"tokens must be a non-empty [seq] or [batch, seq] array, got shape {ids.shape}")
    return ids


def empty_past(config: TinyLlmConfig, batch: int = 1) -> dict[str, np.ndarray]:
    """Zero-length past KV-cache inputs (the prefill step)."""
    shape = (batch, config.kv_heads, 0, config.head_dim)
    return {f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
            for i in range(config.layers) for kind in ("key", "value")}


def prefill_feeds(config: TinyLlmConfig, tokens: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
    """Feeds for the first run over ``tokens`` ([seq] or [batch, seq]) with an empty KV-cache."""
    ids = _as_batch(tokens)
    return {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64), **empty_past(config, ids.shape[0])}


def decode_feeds(
    config: TinyLlmConfig,
    token: int | Sequence[int] | np.ndarray,
    present: Mapping[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """Feeds for the next step: ``token`` (one id, or one id per batch row, or [batch, seq] ids)
    after the previous run's outputs ``present`` (a name -> array mapping; ``logits`` etc. ignored)."""
    ids = np.asarray(token, dtype=np.int64)
    ids = ids.reshape(1, 1) if ids.ndim == 0 else ids.reshape(-1, 1) if ids.ndim == 1 else ids
    feeds: dict[str, np.ndarray] = {"input_ids": ids}
    past_len = None
    for i in range(config.layers):
        for kind in ("key", "value"):
            name = f"present.{i}.{kind}"
            if name not in present:
                raise ValueError(f"decode_feeds: previous outputs lack {name!r}")
            kv = present[name]
            if past_len is None:
                past_len = kv.shape[2]
            feeds[f"past_key_values.{i}.{kind}"] = kv
    if ids.shape[0] != feeds["past_key_values.0.key"].shape[0]:
        raise ValueError(f"decode_feeds: {ids.shape[0]} token rows for a KV-cache of batch "
                         f"{feeds['past_key_values.0.key'].shape[0]}")
    feeds["attention_mask"] = np.ones((ids.shape[0], past_len + ids.shape[1]), np.int64)
    return feeds
