"""Smoke test of ``benchmarks/cache.py`` on a small generated model (minimal sizes, no timing asserted).

A small tiny-llm generated under the name ``tiny`` stands in for the preset (the script never rewrites
a model that exists). The script builds its companions next to it, runs every configuration once cold
and once warm, and the test checks the keys, the task counts and byte counts each configuration must
show, and that the table printer accepts the result.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.prepared.cache import verify
from tests.benchmarks.test_benchmarks_smoke import SMALL, _finite, _module, _run

pytestmark = pytest.mark.slow

CONFIGS = ["none", "complete", "missing1", "missing1-build"]
ROW_KEYS = {"import_ms", "session_ms", "run_ms", "ttfo_ms", "ttfo_process_ms", "ttfo_import_ms", "n"}
OURS_KEYS = {"ready_ms", "hot_ms", "cpu_out_ms", "src_mb_out", "comp_mb_out", "src_mb", "comp_mb", "disk_mb",
             "reads", "prepacks", "read_packed", "persists", "run_compute_ms", "run_wait_ms", "checksum_sum_ms",
             "pread_sum_ms", "decode_sum_ms", "ttfo_ms_min"}


CODE_SLACK_MB = 0.5  # reads of the process's own code, not of model payloads (see test_rows_and_counts)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> tuple[dict, str]:
    d = tmp_path_factory.mktemp("cache-bench-models")
    generate_tiny_llm(d / "tiny", **SMALL)
    configs = CONFIGS + (["ort"] if importlib.util.find_spec("onnxruntime") else [])
    res = _run("cache.py", "--models-dir", str(d), "--presets", "tiny", "--reps", "1", "--tokens", "4", "--hot", "1",
               "--configs", ",".join(configs))
    return res, str(d)


def test_rows_and_counts(result):
    res, _ = result
    assert res["benchmark"] == "cache" and res["tokens"] == 4
    e = res["presets"]["tiny"]
    n = e["entries"]
    assert n > 1 and e["packed_mb"] > e["dropped_mb"] > 0 and e["raw_mb"] > 0
    rows = {(r["cache"], r["config"]): r for r in e["rows"]}
    configs = {c for _, c in rows}
    assert set(rows) == {(c, k) for c in ("cold", "warm") for k in configs} and set(CONFIGS) <= configs
    for (cache, cfg), r in rows.items():
        assert set(r) >= ROW_KEYS, (cache, cfg)
        assert _finite(r["ttfo_ms"], r["ttfo_process_ms"]) and r["ttfo_process_ms"] > r["ttfo_ms"] > 0
        if cfg == "ort":
            continue
        assert set(r) >= OURS_KEYS, (cache, cfg)
        assert r["ready_ms"] >= r["ttfo_ms"] >= r["session_ms"] > 0 and r["corrupt"] == 0
    for cache in ("cold", "warm"):
        none, comp, miss, build = (rows[(cache, c)] for c in CONFIGS)
        # no cache: every packed object is prepacked from source bytes; nothing is read from a companion
        assert (none["prepacks"], none["read_packed"], none["comp_mb"]) == (n, 0, 0)
        # complete: packed payloads only, never a prepack; source bytes are the raw tensors only
        assert (comp["prepacks"], comp["read_packed"], comp["persists"]) == (0, n, 0)
        assert comp["comp_mb"] == pytest.approx(e["packed_mb"]) and comp["src_mb"] == pytest.approx(e["raw_mb"])
        # one entry missing: exactly that one is rebuilt from its sources (and persisted under build_if_missing)
        for r, persists in ((miss, 0), (build, 1)):
            assert (r["prepacks"], r["read_packed"], r["persists"]) == (1, n - 1, persists)
            assert r["comp_mb"] == pytest.approx(e["packed_mb"] - e["dropped_mb"])
            # equal when the missing entry's source is read raw too (a tied embedding)
            assert comp["src_mb"] <= r["src_mb"] <= none["src_mb"]
        # disk_mb is the child's whole read_bytes: it also counts code pages a fresh process faults in
        # (a fresh clone's just-compiled modules read 0.08 MB once), hence the slack beside the tiny payloads
        assert comp["disk_mb"] is None or cache == "cold" or comp["disk_mb"] < e["packed_mb"] / 2 + CODE_SLACK_MB
    assert max(res["resident_before_cold"]) <= 0.05  # eviction worked on the test's files


def test_goals_and_companions(result, capsys):
    res, models_dir = result
    e = res["presets"]["tiny"]
    assert [g["cache"] for g in e["goals"]] == ["cold", "warm"]
    for g in e["goals"]:
        assert _finite(g["packed_read_ms"], g["forward_hot_ms"], g["read_forward_ratio"]) and g["reference_ms"] > 0
        assert g["same_argmax"] is True  # every configuration (and onnxruntime) predicts the same token
        if "vs_ort" in g:
            assert _finite(g["vs_ort"], g["vs_ort_process"]) and g["meets_vs_ort"] is None  # no goal on tiny
    root = os.path.join(models_dir, "companions", "tiny")
    assert verify(os.path.join(root, "complete", "tiny-llm.prepared.onnx")) == []
    assert verify(os.path.join(root, "missing1", "tiny-llm.prepared.onnx")) == []
    assert not os.path.exists(os.path.join(root, "runs"))  # per-process copies are removed
    _module("cache").print_table(res)
    out = capsys.readouterr().out
    assert "TTFO/ref" in out and "first run split" in out
