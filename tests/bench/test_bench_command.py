"""``onnx-prepared bench``: side-by-side fresh processes, the JSON/table, the trace and the timeline PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from onnx_prepared.bench.timeline import COLOURS, HEIGHT_PX, WIDTH_PX
from tests.helpers.models import gemm_mlp


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def test_bench_json_trace_and_timeline_png(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("onnxruntime")
    image = pytest.importorskip("PIL.Image")
    model = gemm_mlp(tmp_path, layers=4, width=64)
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    r = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", "bench", model, "--reps", "1", "--steady", "2",
                        "--cold", "--trace", str(trace), "--png", str(png), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [row["runtime"] for row in res["rows"]] == ["ours", "onnxruntime"] and res["page_cache"] == "cold"
    for row in res["rows"]:
        assert row["ttfo_ms"] > row["first_run_ms"] > 0 and row["peak_rss_mb"] > 0 and row["steady_ms"] > 0
    assert res["first_output_max_abs_diff"] < 1e-3 and set(res["ratios"]) >= {"ttfo_ms", "steady_ms"}

    events = json.loads(trace.read_text())["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X"]
    assert {e["cat"] for e in tasks} >= {"io", "cpu"}
    assert any(e["name"].endswith(".read_source") for e in tasks) and any(e["name"].startswith("I.") for e in tasks)
    assert [e["name"] for e in events if e.get("ph") == "i"] == ["session start", "first output"]

    layout = res["png"]
    with image.open(png) as im:
        assert im.size == (WIDTH_PX, HEIGHT_PX) == tuple(layout["size"])
        rgb = im.convert("RGB")
        colours = {_rgb(COLOURS[k]) for k in layout["kinds"]}
        assert {"read", "inference"} <= set(layout["kinds"])
        assert any(name.startswith("io-") for name in layout["lanes"])
        assert any(name.startswith("cpu-") for name in layout["lanes"])
        def near(px):  # antialiased edges blend a bar's colour: within a small distance counts
            return any(sum(abs(a - b) for a, b in zip(px, c)) < 60 for c in colours)

        for lane, row in layout["lanes"].items():  # every lane has at least one task bar on its centre row
            assert any(near(rgb.getpixel((x, row))) for x in range(WIDTH_PX)), lane
        x = layout["first_output_px"]  # the first-output marker is a dark vertical line
        dark = sum(1 for y in range(HEIGHT_PX) if max(rgb.getpixel((x, y))) < 60 or
                   max(rgb.getpixel((x + 1, y))) < 60)
        assert dark > HEIGHT_PX // 4


def test_bench_table_and_errors(tmp_path):
    model = gemm_mlp(tmp_path)
    r = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", "bench", model, "--reps", "1", "--steady", "1",
                        "--no-ort"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:2] == ["TTFO", "ms"] and "ours" in r.stdout and "load average" in r.stdout
    r = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", "bench", model, "--reps", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "expected an integer >= 1" in r.stderr


_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(_BENCH) if f.endswith(".py") and f[0] != "_"))
def test_every_benchmark_runs_as_a_module_and_as_a_script(name):
    root = os.path.dirname(_BENCH)
    for argv in (["-m", f"benchmarks.{name}"], [os.path.join("benchmarks", f"{name}.py")]):
        r = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=root)
        assert r.returncode == 0 and "usage" in r.stdout, r.stderr[-2000:]
