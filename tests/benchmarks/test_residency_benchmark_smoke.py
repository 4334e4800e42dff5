"""Smoke test of ``benchmarks/residency.py`` on a small generated model: it completes and prints its keys.

The script finds its models in ``--models-dir``; a one-block tiny-llm generated here under the name
``tiny`` stands in for the preset (and for the arena table's spec model). Minimal sizes, one repetition.
No timing is asserted: the
test checks the JSON keys, that every budget gave the unlimited run's greedy tokens bit-identically and
onnxruntime's tokens, that budgets below the total evicted, and that both table printers accept the result.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from onnx_prepared.generate import generate_tiny_llm

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SMALL = dict(layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512, block_size=16, context_length=64)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    pytest.importorskip("onnxruntime")
    d = tmp_path_factory.mktemp("bench-models")
    generate_tiny_llm(d / "tiny", **SMALL)
    p = subprocess.run([sys.executable, str(BENCH / "residency.py"), "--models-dir", str(d), "--presets", "tiny",
                        "--reps", "1", "--tokens", "4", "--steps", "2", "--caches", "warm,none", "--variants", "",
                        "--baselines", "numpy", "--fixed-mib", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _module():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_residency", BENCH / "residency.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def test_budget_rows(result):
    assert result["benchmark"] == "residency"
    e = result["presets"]["tiny"]
    assert e["total_bytes"] > 0 and e["objects"] > 0 and e["largest_bytes"] <= e["total_bytes"]
    assert {"pread_fresh_ms_per_mib", "pread_reused_ms_per_mib", "sha256_ms_per_mib"} <= set(e["restore_cost"])
    assert set(e["baseline"]) == {"numpy"} and e["baseline"]["numpy"] > 0
    ort = e["ort"]
    assert _finite(ort["peak_rss_mb"], ort["ttfo_ms"], ort["decode_tok_s"]) and len(ort["tokens"]) == 3
    rows = {(r["limit"], r["cache"]): r for r in e["rows"]}
    assert set(rows) == {(lim, c) for lim in ("unlimited", "1/4", "1/8", "fixed") for c in ("warm", "none")}
    for (lim, _cache), r in rows.items():
        assert {"peak_rss_mb", "ttfo_ms", "decode_tok_s", "evictions", "evictions_per_token", "source_read_mb",
                "packed_read_mb", "decode_read_mb_per_token", "arena_peak_mb", "decode_split_ms_per_token",
                "decode_restores_per_token", "rss_trimmed_mb", "rss_vs_ort", "decode_vs_unlimited"} <= set(r), lim
        assert _finite(r["peak_rss_mb"], r["ttfo_ms"], r["decode_tok_s"]) and r["peak_rss_mb"] > 0
        assert r["bit_identical"] is True  # same greedy tokens and logits as the unlimited run
        assert r["same_tokens_as_ort"] is True and r["ort_prefix"] == 3 and r["correct"] is True
        assert r["ort_prefill_rel_err"] < 1e-2
        if lim in ("1/4", "1/8"):
            assert r["evictions"] > 0 and r["arena_peak_mb"]["prepared"] < e["total_bytes"] / 2**20
        if lim == "unlimited":
            assert r["evictions"] == 0 and r["limit_mb"] is None
    warm_restores = rows[("1/4", "warm")]["decode_restores_per_token"]
    assert warm_restores["prepack"] == 0 and warm_restores["read_packed"] > 0  # restored from the companion
    assert rows[("1/4", "none")]["decode_restores_per_token"]["prepack"] > 0  # no companion: re-prepacked
    assert set(e["goals"]) == {"rss", "decode"}
    assert isinstance(e["goals"]["rss"]["met"], bool) and isinstance(e["goals"]["decode"]["met"], bool)


def test_arena_table(result):
    t = result["arena_table"]
    assert t["layers"] == 1 and t["limit_bytes"] == 2 * t["block_bytes"] > 0
    steps = [r["step"] for r in t["rows"]]
    assert steps == ["0", "run-1 embedding", "run-1 L0", "run-1 final norm + LM head", "end of run-1",
                     "run-2 embedding", "run-2 L0"]
    for r in t["rows"]:
        assert {"PreparationArena", "PreparedArena", "ExecutionArena", "IOArena", "resident", "actions"} <= set(r)
    assert t["rows"][0]["PreparedArena"] == 0  # nothing prepared before the first run
    assert "publish L0" in t["rows"][1]["actions"] + t["rows"][2]["actions"]
    assert t["end_of_run1"]["io"]["live_mb"] > 0  # the outputs the caller holds


def test_printers(result, capsys):
    _module().print_table(result)
    out = capsys.readouterr().out
    assert "goal: tiny, 1 MiB" in out and "Arena memory along the concrete plan" in out
    assert "run-2 L0" in out
