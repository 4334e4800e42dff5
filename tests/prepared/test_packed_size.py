"""A packed MatMulNBits entry is never larger than its source (issue 12, item 3; companion format 5).

The panel16 payload holds the panel buffer only: K, N, block size and zero-point kind come from the
entry's layout key, which the companion records per entry. N is a multiple of 16 and the scales are
float32 in the generated presets, so the packed bytes equal the source bytes exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.model import load_model
from onnx_prepared.prepared.cache import PreparedModelStore, source_model_digest, verify
from onnx_prepared.runtime import RuntimeSession


def test_tiny_preset_matmul_nbits_entries_are_no_larger_than_their_sources(tmp_path):
    path = generate_tiny_llm(tmp_path / "m", preset="tiny")
    companion = tmp_path / "c" / "m.prepared.onnx"
    feeds = prefill_feeds(TinyLlmConfig.from_preset("tiny"), [1, 2, 3, 4])
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(companion)}
    with RuntimeSession(path) as s:
        want = s.run(feeds)[0]
    with RuntimeSession(path, opts) as s:
        s.prepare()
    weights = load_model(path).weights
    store = PreparedModelStore(companion, source_digest=source_model_digest(path), policy="read_only")
    nbits = {n: e for n, e in store.entries().items() if e.layout.startswith("matmul-nbits-q4-panel16")}
    assert len(nbits) == 17  # every MatMulNBits of the preset: 4 per layer x 4 layers + the LM head
    for name, e in nbits.items():
        source = sum(weights[s].nbytes for s in e.lineage)
        assert e.length <= source, (name, e.length, source)
        assert e.length == source  # N a multiple of 16, float32 scales: exactly the source's bytes
    assert verify(companion) == []
    with RuntimeSession(path, dict(opts, prepared_model_policy="read_only")) as s:  # the entries read back
        s.prepare()
        got = s.run(feeds)[0]
        counters = dict(s.state.counters)
    assert sum(1 for k in counters if k.startswith("read_packed:")) == 17
    assert not any(k.startswith("prepack:") for k in counters)
    np.testing.assert_array_equal(got, want)


def test_fused_qdq_int4_entries_read_back_without_a_header(tmp_path):
    """DequantizeLinear + MatMul fused to the panel16 layout (kernels/dq_matmul.py) round-trips too."""
    import shutil

    src = Path(__file__).parents[1] / "fixtures" / "llama_qdq_int4"
    shutil.copytree(src, tmp_path / "m")
    path = str(tmp_path / "m" / "model.onnx")
    companion = tmp_path / "c" / "m.prepared.onnx"
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(companion)}
    with RuntimeSession(path, opts) as s:
        s.prepare()
    store = PreparedModelStore(companion, source_digest=source_model_digest(path), policy="read_only")
    dq = [e for e in store.entries().values() if e.layout.startswith("dq-")]
    assert dq
    weights = load_model(path).weights
    assert all(e.length <= sum(weights[s].nbytes for s in e.lineage) for e in dq)
    with RuntimeSession(path, dict(opts, prepared_model_policy="read_only")) as s:
        s.prepare()
        counters = dict(s.state.counters)
    assert sum(1 for k in counters if k.startswith("read_packed:")) == len(store.entries())
    assert not any(k.startswith(("prepack:", "cache_corrupt:")) for k in counters)
