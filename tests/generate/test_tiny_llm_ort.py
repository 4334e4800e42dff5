"""onnxruntime runs the generated model unmodified; its KV-cache layout and semantics are what we claim.

The numpy reference below is the model's meaning written out once (tied INT4 embedding, RMSNorm,
fused QKV with half-split rotary, grouped-query causal attention, SiLU(gate) * up, tied LM head).
"""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.generate import TinyLlmConfig, decode_feeds, generate_tiny_llm, prefill_feeds, weight_names
from onnx_prepared.generate.quantize import dequantize_int4
from onnx_prepared.generate.tiny_llm import _norm_names
from onnx_prepared.model import ExternalDataReader, load_model

ort = pytest.importorskip("onnxruntime")


def _session(path: str):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _run(sess, feeds) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _tokens(config: TinyLlmConfig, n: int) -> np.ndarray:
    return np.random.default_rng(42).integers(0, config.vocab, n)


def test_prefill_then_decode_matches_longer_prefill(small_model, small_config):
    c, sess = small_config, _session(small_model)
    toks = _tokens(c, 10)
    out = _run(sess, prefill_feeds(c, toks[:8]))
    assert out["logits"].shape == (1, 8, c.vocab) and np.isfinite(out["logits"]).all()
    assert out["present.0.key"].shape == (1, c.kv_heads, 8, c.head_dim)
    for n in (8, 9):  # two decode steps feeding present -> past
        out = _run(sess, decode_feeds(c, toks[n], out))
        full = _run(sess, prefill_feeds(c, toks[:n + 1]))
        assert out["logits"].shape == (1, 1, c.vocab) and np.isfinite(out["logits"]).all()
        np.testing.assert_allclose(out["logits"][0, -1], full["logits"][0, n], atol=1e-4, rtol=0)
        for i in range(c.layers):
            for kind in ("key", "value"):
                name = f"present.{i}.{kind}"
                assert out[name].shape == (1, c.kv_heads, n + 1, c.head_dim)
                np.testing.assert_allclose(out[name], full[name], atol=1e-5, rtol=0)
    assert np.std(full["logits"]) > 0.05  # weights are not degenerate


def test_batched_prefill_matches_single_rows(small_model, small_config):
    c, sess = small_config, _session(small_model)
    toks = np.stack([_tokens(c, 6), _tokens(c, 7)[1:]])
    both = _run(sess, prefill_feeds(c, toks))
    for b in range(2):
        one = _run(sess, prefill_feeds(c, toks[b]))
        np.testing.assert_allclose(both["logits"][b], one["logits"][0], atol=1e-4, rtol=0)


def test_onnxruntime_matches_numpy_reference(tmp_path, small_config):
    # accuracy_level=0: MatMulNBits computes in float, so float references agree to rounding noise.
    import dataclasses

    c = dataclasses.replace(small_config, accuracy_level=0)
    path = generate_tiny_llm(tmp_path, config=c)
    sess, toks = _session(path), _tokens(c, 9)
    ref_logits, ref_kv = _reference(c, path, toks)
    out = _run(sess, prefill_feeds(c, toks[:7]))
    np.testing.assert_allclose(out["logits"][0], ref_logits[:7], atol=1e-4, rtol=0)
    out = _run(sess, decode_feeds(c, toks[7], out))
    out = _run(sess, decode_feeds(c, toks[8], out))
    np.testing.assert_allclose(out["logits"][0, 0], ref_logits[8], atol=1e-4, rtol=0)
    for i in range(c.layers):
        np.testing.assert_allclose(out[f"present.{i}.key"][0], ref_kv[i][0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(out[f"present.{i}.value"][0], ref_kv[i][1], atol=1e-5, rtol=0)


def _reference(c: TinyLlmConfig, path: str, toks: np.ndarray):
    """Full-sequence float64 forward pass from the stored (dequantized) weights."""
    m = load_model(path)
    with ExternalDataReader() as r:
        def mat(logical):
            w, s = weight_names(c, logical)
            return dequantize_int4(r.read(m.weights[w]), r.read(m.weights[s])).astype(np.float64)

        norm = {logical: r.read(m.weights[name]).astype(np.float64) for logical, name in _norm_names(c)}
        cos, sin = (r.read(m.weights[n]).astype(np.float64) for n in ("cos_cache", "sin_cache"))
        emb = mat("emb")

        def rms(x, g):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_eps) * g

        def rope(x):  # x [S, heads, D], half-split (rotary_interleaved=0), positions 0..S-1
            h = c.head_dim // 2
            cs, sn = cos[: len(x), None, :], sin[: len(x), None, :]
            return np.concatenate([x[..., :h] * cs - x[..., h:] * sn, x[..., h:] * cs + x[..., :h] * sn], -1)

        s, d, nq, nkv = len(toks), c.head_dim, c.heads, c.kv_heads
        residual, kv, down = emb[toks], [], 0.0
        for i in range(c.layers):
            residual = residual + down  # layer 0: plain RMSNorm of the embedding; later: residual add first
            h = rms(residual, norm[f"layer{i}.input_norm"])
            qkv = h @ mat(f"layer{i}.qkv").T
            q = rope(qkv[:, : nq * d].reshape(s, nq, d))
            k = rope(qkv[:, nq * d: (nq + nkv) * d].reshape(s, nkv, d))
            v = qkv[:, (nq + nkv) * d:].reshape(s, nkv, d)
            kv.append((k.transpose(1, 0, 2), v.transpose(1, 0, 2)))
            kh = np.repeat(k, nq // nkv, axis=1)  # query head j reads KV head j // (nq / nkv)
            vh = np.repeat(v, nq // nkv, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, kh) / np.sqrt(d)
            scores[:, ~np.tri(s, dtype=bool)] = -np.inf
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            attn = np.einsum("hqk,khd->qhd", p, vh).reshape(s, nq * d)
            residual = residual + attn @ mat(f"layer{i}.attn_out").T
            h = rms(residual, norm[f"layer{i}.post_attention_norm"])
            gu = h @ mat(f"layer{i}.gate_up").T
            gate, up = gu[:, : c.intermediate], gu[:, c.intermediate:]
            down = (gate / (1 + np.exp(-gate)) * up) @ mat(f"layer{i}.down").T
        logits = rms(residual + down, norm["final_norm"]) @ emb.T
    return logits, kv
