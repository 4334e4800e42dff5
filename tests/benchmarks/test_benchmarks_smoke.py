"""Smoke test of the prepared-execution benchmarks: each script runs on a small generated model.

The scripts find their models in ``--models-dir`` and never rewrite one that exists, so a small model
generated here under the name ``tiny`` stands in for the preset. Each script runs in a subprocess with
``--json`` and minimal sizes; the test checks that it completes, prints the expected keys with sane
values, and that its table printer accepts the result. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onnx_prepared.generate import generate_tiny_llm

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SMALL = dict(layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512, block_size=16, context_length=64)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("bench-models")
    generate_tiny_llm(d / "tiny", **SMALL)
    return str(d)


def _run(script: str, *args: str) -> dict:
    p = subprocess.run([sys.executable, str(BENCH / script), *args, "--json"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _module(name: str):
    """Import a benchmark script (it imports ``_common`` from its own folder)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def _finite(*xs: float) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def test_hot_path(models_dir, capsys):
    res = _run("hot_path.py", "--models-dir", models_dir, "--reps", "1", "--batch-ms", "1", "--prompt", "4",
               "--mlp-layers", "2", "--mlp-width", "16")
    assert res["benchmark"] == "hot_path"
    assert [c["case"] for c in res["cases"]] == ["tiny-llm decode (past 4)", "tiny-llm prefill (4 tok)",
                                                 "gemm-mlp 2x16"]
    for c in res["cases"]:
        assert {"direct_us", "run_us", "run_async_us", "ratio", "extra_us", "async_ratio", "bind_feeds_us",
                "empty_task_us", "outputs_us", "direct_thread_us"} <= set(c)
        assert _finite(c["direct_us"], c["run_us"], c["run_async_us"], c["ratio"]) and c["direct_us"] > 0
        assert c["identical"] is True  # direct replay, run and run_async gave the same outputs
        assert c["all_hot"] is True  # every timed run took the hot path
    assert c["actions"] == 3  # gemm, relu, gemm
    _module("hot_path").print_table(res)
    assert "run/direct" in capsys.readouterr().out


def test_loading(models_dir, capsys):
    res = _run("loading.py", "--models-dir", models_dir, "--presets", "tiny", "--reps", "1", "--tokens", "4")
    assert res["benchmark"] == "loading"
    e = res["presets"]["tiny"]
    modes = ("stream", "stream_prefetch", "prepare", "sequential")
    assert set(e["runs"]) == {f"{c}/{m}" for c in ("cold", "warm") for m in modes}
    reads = {r["reads"] for r in e["runs"].values()}
    assert len(reads) == 1 and reads.pop() > 0  # every mode reads the same payloads, each once
    for key, r in e["runs"].items():
        assert {"import_ms", "plan_ms", "read_mb", "read_total_ms", "prepack_total_ms", "first_node_ms",
                "ttfo_ms", "ttfo_process_ms", "ready_ms", "peak_rss_mb", "max_inflight_mb"} <= set(r), key
        assert r["prepacks"] > 0 and r["ttfo_ms"] >= r["plan_ms"] > 0
        assert r["first_node_ms"] <= r["ttfo_ms"]
    s = e["runs"]["cold/stream_prefetch"]
    assert {"submit_ms", "yields", "wait_total_ms", "queue_io_median_ms", "overlap_ready", "overlap_ttfo"} <= set(s)
    assert 0 <= s["overlap_ready"]["any"] <= 1.0 + 1e-9
    assert set(e["sequential_vs_parallel"]) == {"cold", "warm"}
    for v in ("alone", "shared"):
        assert e["cancel"][v]["waiting"] is True  # the run had yielded on the gated weight when cancelled
        assert e["cancel"][v]["states"] == ["cancelled"]
    assert e["cancel"]["shared"]["waited_for_read"] is False  # C5: a shared producer is released, not joined
    assert max(e["resident_before"]["cold"]) <= 0.05  # eviction worked on the test's files
    _module("loading").print_table(res)
    out = capsys.readouterr().out
    assert "sequential vs parallel" in out and "cancellation latency" in out


def test_ttfo(models_dir, capsys):
    runtimes = "ort,ours,ours+cache" if importlib.util.find_spec("onnxruntime") else "ours,ours+cache"
    res = _run("ttfo.py", "--models-dir", models_dir, "--models", "tiny", "--prompts", "4", "--reps", "1",
               "--caches", "warm", "--runtimes", runtimes)
    assert res["benchmark"] == "ttfo"
    by_rt = {c["runtime"]: c for c in res["cases"]}
    assert set(by_rt) == set(runtimes.split(","))
    for c in res["cases"]:
        assert {"interp_ms", "numpy_ms", "import_ms", "session_ms", "run_ms", "ttfo_ms", "peak_rss_mb"} <= set(c)
        assert _finite(c["ttfo_ms"]) and c["ttfo_ms"] >= c["run_ms"] > 0
        assert c["cpu_ms"] > 0 and (c["runq_ms"] is None or c["runq_ms"] >= 0)
    for rt in ("ours", "ours+cache"):
        c = by_rt[rt]
        assert {"parse_ms", "resolve_ms", "plan_ms", "state_ms", "first_node_at_ms", "read_mb_before_output"} <= set(c)
        assert c["interp_ms"] < c["first_node_at_ms"] <= c["ttfo_ms"] and c["read_mb_before_output"] > 0
    assert by_rt["ours+cache"]["companion_ms"] > 0 and "hit_vs_miss" in by_rt["ours+cache"]
    if "ort" in by_rt:
        assert "vs_ort" in by_rt["ours"] and by_rt["ours"]["delta_ms"].keys() >= {"import_ms", "run_ms"}
    prof = res["profile"][0]
    assert prof["tokens"] == 4 and prof["first"]["total_ms"] > 0
    assert any(k.startswith("prepacked:matmul-nbits") for k in prof["first"]["by_kernel_ms"])
    _module("ttfo").print_table(res)
    out = capsys.readouterr().out
    assert "TTFO ms" in out and "by kernel" in out


def test_ttfo_compiles_the_ab_tree_too(tmp_path):
    """--ab PYTHONPATH=<tree>: that tree's modules are compiled like the parent's, so its children do not
    compile them in their import phase (PYTHONDONTWRITEBYTECODE)."""
    tree = tmp_path / "tree"
    (tree / "onnx_prepared").mkdir(parents=True)
    (tree / "onnx_prepared" / "probe_mod.py").write_text("X = 1\n")
    _module("ttfo").compile_package(f"PYTHONPATH={tmp_path / 'missing'}{os.pathsep}{tree}")
    assert [p.name.split(".")[0] for p in (tree / "onnx_prepared" / "__pycache__").iterdir()] == ["probe_mod"]


def test_models_are_never_rewritten(models_dir):
    path = os.path.join(models_dir, "tiny", "tiny-llm.onnx")
    before = os.stat(path).st_mtime_ns
    common = _module("_common")
    assert common.tiny_llm_path(models_dir, "tiny") == path
    assert os.stat(path).st_mtime_ns == before


def test_cnn_ops(capsys):
    pytest.importorskip("onnxruntime")
    res = _run("cnn_ops.py", "--cases", "mbv3_dw3x3_16@112,lstm_bi_h64_seq50", "--repeat", "1")
    assert [r["case"] for r in res["rows"]] == ["mbv3_dw3x3_16@112", "lstm_bi_h64_seq50"]
    for r in res["rows"]:
        assert _finite(r["ours_ms"], r["ort_ms"], r["x_ort"], r["cpu_x_ort_1t"])
        assert r["max_abs_diff"] < 1e-4  # ours agrees with onnxruntime on the benchmarked node
    _module("cnn_ops")._print(res)
    assert "x ort" in capsys.readouterr().out
