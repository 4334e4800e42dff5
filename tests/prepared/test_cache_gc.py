"""Stale layouts: entries of a superseded layout version are skipped by readers, dropped by the next
publication and removed by ``cache gc``, which also copies live payloads out of mostly-dead data files."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from onnx_prepared import cli
from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.kernels._q4_panels import LAYOUT_VERSION
from onnx_prepared.prepared import cache as cache_mod
from onnx_prepared.prepared.cache import (
    PreparedModelPolicy,
    PreparedModelStore,
    collect_garbage,
    info,
    source_model_digest,
    verify,
)
from onnx_prepared.prepared.cache_format import superseded
from onnx_prepared.resolve.keys import PreparedKey
from onnx_prepared.runtime import RuntimeSession

SRC = hashlib.sha256(b"source model").hexdigest()
BUILD = PreparedModelPolicy.BUILD_IF_MISSING


def _key(name: str, layout: str) -> PreparedKey:
    return PreparedKey((name,), layout, "cpu", hashlib.sha256(name.encode()).hexdigest())


def _data_bytes(folder) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".data"))


def test_only_an_older_version_of_the_same_layout_and_sources_is_superseded(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    keys = (_key("A", "q4-panel16-v1-block32"), _key("A", "q4-panel16-v2-block32"),
            _key("A", "q4-panel16-v1-block64"),  # another block size: another layout, kept
            _key("B-v1-x", "gemm"), _key("B-v2-x", "gemm"),  # a version in a source name: not a layout
            _key("C", "q4-panel16-v1-block32"))  # no newer sibling: kept
    with PreparedModelStore(path, source_digest=SRC, policy=BUILD) as s:
        for k in keys:
            s.put(k, np.zeros(8, np.uint8))
        s.flush()
        names = {f"prepared/{k.lineage[0]}@{k.layout}" for k in keys}
        assert set(s.entries()) == names - {"prepared/A@q4-panel16-v1-block32"}  # the publication dropped it
        assert superseded(s.entries().values()) == set()


def test_gc_drops_superseded_entries_and_compacts_a_mostly_dead_file(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    live = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)
    new = np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8)
    with PreparedModelStore(path, source_digest=SRC, policy=BUILD) as s:  # one file: a live and a stale entry
        s.put(_key("B", "gemm"), live)
        s.put(_key("A", "q4-v1"), np.ones(200_000, np.uint8))
        s.flush()
    with PreparedModelStore(path, source_digest=SRC, policy=BUILD) as s:  # the layout bump's build
        s.put(_key("A", "q4-v2"), new)
        s.flush()
    # that publication dropped A@q4-v1 from the index, but its bytes stay in B's file
    assert info(path)["entries"] == 2 and len(info(path)["data_files"]) == 2
    before = _data_bytes(tmp_path)
    dropped: list[str] = []
    removed = collect_garbage(path, dropped=dropped)
    assert dropped == [] and len(removed) == 1  # B copied to a new file, the mostly dead one removed
    assert _data_bytes(tmp_path) < before // 4
    assert verify(path) == [] and info(path)["entries"] == 2
    with PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.READ_ONLY) as r:
        np.testing.assert_array_equal(r.read_payload(r.lookup(_key("B", "gemm"))), live)
        np.testing.assert_array_equal(r.read_payload(r.lookup(_key("A", "q4-v2"))), new)
    assert collect_garbage(path, dropped=dropped) == [] and dropped == []  # nothing left to do


def test_a_layout_bump_leaves_stale_entries_that_gc_removes_and_the_model_still_hits(tmp_path, capsys,
                                                                                   monkeypatch):
    """The medium companion's pile-up, on the tiny preset: every panel16 entry written again under an
    older version, in a data file of their own, by a writer that keeps them in the index (one from before
    publications dropped superseded entries, or an older release in a rolling upgrade)."""
    path = generate_tiny_llm(tmp_path / "m", preset="tiny")
    companion = tmp_path / "c" / "m.prepared.onnx"
    feeds = prefill_feeds(TinyLlmConfig.from_preset("tiny"), [1, 2, 3, 4])
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(companion)}
    with RuntimeSession(path, opts) as s:
        s.prepare()
        want = s.run(feeds)[0]
    digest = source_model_digest(path)
    monkeypatch.setattr(cache_mod, "superseded", lambda entries: set())  # that writer
    with PreparedModelStore(companion, source_digest=digest, policy=BUILD) as s:
        current = s.entries()
        for e in current.values():
            if "-panel16-v" in e.layout:
                old = e.layout.replace(f"-v{LAYOUT_VERSION}-", f"-v{LAYOUT_VERSION - 1}-")
                s.put(PreparedKey(e.lineage, old, e.device, e.lineage_digest), np.zeros(e.length, np.uint8))
        stale = s.pending
        s.flush()
    monkeypatch.undo()
    assert stale == 17 and info(companion)["entries"] == len(current)  # readers skip them already
    before = _data_bytes(companion.parent)
    assert cli.main(["cache", "gc", str(companion)]) == 0
    assert f"1 file(s) removed, {stale} stale entries dropped" in capsys.readouterr().out
    assert _data_bytes(companion.parent) < before
    assert verify(companion) == [] and set(info(companion)["layouts"]) == {e.layout for e in current.values()}
    with RuntimeSession(path, dict(opts, prepared_model_policy="require_complete")) as s:
        got = s.run(feeds)[0]
        assert not any(k.startswith("prepack:") for k in s.state.counters)
    np.testing.assert_array_equal(got, want)
