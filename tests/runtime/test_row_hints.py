"""A cold run's first rows are asked for when it is submitted (runtime/row_hints.py): before any read of
its producers starts, the rows its feed-indexed Gather will read; the run computes what it did without."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.model import ExternalDataReader
from onnx_prepared.resolve.rows import hint_ranges, row_runs
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime.state import PreparedExecutionState

EMBED = "model.embed_tokens.weight"
# vocab x hidden x 4 B = 1 MiB: the untied float32 embedding is a row table
CFG = dict(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=4096, block_size=16,
           context_length=64, embedding="fp32")
TOKENS = [900, 5, 17, 3000, 5, 4095, 18]  # scattered, one repeated: runs 5, 17-18, 900, 3000, 4095


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = generate_tiny_llm(tmp_path_factory.mktemp("rh") / "m", **CFG)
    return str(path), prefill_feeds(TinyLlmConfig.from_preset(None, **CFG), TOKENS)


def test_a_cold_runs_rows_are_asked_for_before_its_producers_read(model, monkeypatch):
    path, feeds = model
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        want = s.run(feeds)
    events: list[tuple] = []

    class Recording(ExternalDataReader):
        def will_need(self, desc, ranges):
            events.append(("hint", desc.name, list(ranges)))
            super().will_need(desc, ranges)

    orig_read = PreparedExecutionState.read_source

    def read_source(self, name, entry):
        events.append(("read", name))
        return orig_read(self, name, entry)

    monkeypatch.setattr(PreparedExecutionState, "read_source", read_source)
    reader = Recording(defer_verify=True)
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}, reader=reader) as s:
        d = s.resolved.manifest.active[EMBED].descriptor
        got = s.run(feeds)
    row_bytes = d.payload.length // d.dims[0]
    rows = np.unique(TOKENS)
    starts, stops = row_runs(rows)
    ranges = hint_ranges([(d.payload.offset + int(rows[a]) * row_bytes, (b - a) * row_bytes)
                          for a, b in zip(starts, stops)])
    assert events[0] == ("hint", EMBED, ranges)  # at submission, before the first read task
    assert any(e[0] == "read" for e in events)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)

