"""``onnx-prepared bench MODEL``: ours and onnxruntime side by side, each cold start in a fresh process.

Repetitions are interleaved (the order rotates each repetition) and the table shows medians: time to
first output (spawn to the first run's outputs, less loading the feeds), its phases, peak RSS, and the
steady run (after ``prepare()`` for ours). ``--cold`` evicts the model's files from the page cache before
every process (posix_fadvise); ``--trace`` writes the first traced run's Chrome trace, ``--png`` draws it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from onnx_prepared.cli_common import EXIT_OK, existing_file, positive

RUNTIMES = ("ours", "ort")
COLUMNS = (("TTFO ms", "ttfo_ms", ".1f"), ("interp", "interp_ms", ".0f"), ("numpy", "numpy_ms", ".0f"),
           ("import", "import_ms", ".0f"), ("session", "session_ms", ".1f"), ("first run", "first_run_ms", ".1f"),
           ("read*", "read_ms", ".1f"), ("prepack*", "prepack_ms", ".1f"), ("ready", "ready_ms", ".1f"),
           ("steady", "steady_ms", ".2f"), ("peak RSS MB", "peak_rss_mb", ".0f"))


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    from onnx_prepared.options import POLICIES

    b = subparsers.add_parser("bench", help="time MODEL's cold start and steady run, ours beside onnxruntime",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("model", type=existing_file("model"), help="the .onnx file")
    b.add_argument("--cold", action="store_true", help="evict the model's files from the page cache before each "
                                                       "process (default: warm, files read once before)")
    b.add_argument("--reps", type=positive, default=3, help="interleaved repetitions per runtime (default 3)")
    b.add_argument("--tokens", type=positive, default=16,
                   help="prompt length for LLM inputs: symbolic sequence dims (default 16); past dims are 0")
    b.add_argument("--feeds", type=existing_file("feeds file"), default=None,
                   help="an .npz of inputs keyed by input name (default: made from the declared inputs)")
    b.add_argument("--steady", type=positive, default=5, help="runs after the first, median = steady (default 5)")
    b.add_argument("--no-ort", action="store_true", help="ours only")
    b.add_argument("--cache", default=None, metavar="PATH", help="ours with this companion prepared model "
                                                                 "(build_if_missing unless --policy)")
    b.add_argument("--policy", choices=POLICIES, default=None, help="ours' prepared cache policy")
    b.add_argument("--trace", default=None, metavar="OUT.json", help="write the first run of ours as a "
                                                                    "Chrome/Perfetto trace of every task")
    b.add_argument("--png", default=None, metavar="OUT.png", help="draw that run's timeline (needs matplotlib, "
                                                                 "the plot extra)")
    b.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    b.set_defaults(fn=cmd_bench)
    return b


def cmd_bench(args: argparse.Namespace) -> int:
    import numpy as np

    from onnx_prepared.bench import page_cache
    from onnx_prepared.bench.feeds import make_feeds
    from onnx_prepared.progress import reporter

    runtimes = ["ours"] if args.no_ort else list(RUNTIMES)
    if "ort" in runtimes:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            print("onnxruntime is not installed: ours only (pip install 'onnx-prepared[bench]')", file=sys.stderr)
            runtimes = ["ours"]
    policy = args.policy or ("build_if_missing" if args.cache else "disabled")
    state = "cold" if args.cold else "warm"
    files = page_cache.model_files(args.model)
    child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
    raw: dict[str, list[dict]] = {r: [] for r in runtimes}
    with tempfile.TemporaryDirectory(prefix="onnx-prepared-bench-") as tmp:
        feeds_path = os.path.join(tmp, "feeds.npz")
        if args.feeds:
            feeds_path = args.feeds
        else:
            np.savez(feeds_path, **make_feeds(args.model, args.tokens))
        trace = args.trace or (os.path.join(tmp, "trace.json") if args.png else None)
        total = args.reps * len(runtimes)
        bar = reporter(True, total, "bench", unit="run")
        for rep in range(args.reps):
            for i, rt in enumerate(runtimes[rep % len(runtimes):] + runtimes[:rep % len(runtimes)]):
                page_cache.set_state(files, state)
                cmd = [child, "--runtime", rt, "--model", args.model, "--feeds", feeds_path,
                       "--steady", str(args.steady), "--policy", policy]
                if args.cache:
                    cmd += ["--cache-path", args.cache]
                if rt == "ours" and trace and not raw["ours"]:
                    cmd += ["--trace", trace]
                raw[rt].append(_spawn(cmd))
                if bar is not None:
                    bar(rep * len(runtimes) + i + 1, total)
        result = _summarize(args, raw, state, policy)
        if args.trace:
            result["trace"] = os.path.abspath(args.trace)
        if args.png:
            from onnx_prepared.bench.timeline import draw

            name = os.path.basename(args.model)
            layout = draw(trace, args.png, title=f"{name}: {state} start, first run of ours "
                                                 f"(TTFO {raw['ours'][0]['ttfo_ms']:.0f} ms from process spawn)")
            result["png"] = {"path": os.path.abspath(args.png), **layout}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_table(result))
        for key in ("trace", "png"):
            if key in result:
                where = result[key] if key == "trace" else result[key]["path"]
                print(f"{key}: {where}")
    return EXIT_OK


def _spawn(cmd: list[str]) -> dict:
    from onnx_prepared.errors import OnnxPreparedError

    t = time.perf_counter()
    p = subprocess.run([sys.executable, *cmd, "--spawn", repr(t)], capture_output=True, text=True)
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1:] or ["no output"]
        raise OnnxPreparedError(f"bench: the {cmd[2]} process failed: {tail[0]}")
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])


def _summarize(args: argparse.Namespace, raw: dict[str, list[dict]], state: str, policy: str) -> dict:
    import numpy as np

    rows = []
    for rt, runs in raw.items():
        row: dict[str, Any] = {"runtime": "ours" if rt == "ours" else "onnxruntime", "n": len(runs)}
        for _, key, _ in COLUMNS + (("", "run_compute_ms", ""), ("", "run_wait_ms", "")):
            vals = [r[key] for r in runs if r.get(key) is not None]
            row[key] = statistics.median(vals) if vals else None
        rows.append(row)
    res: dict[str, Any] = {"benchmark": "bench", "model": os.path.abspath(args.model), "page_cache": state,
                           "reps": args.reps, "tokens": args.tokens, "policy": policy, "rows": rows,
                           "load_avg": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count()}
    if len(rows) == 2:
        ours, ort = rows
        res["ratios"] = {k: ours[k] / ort[k] for k in ("ttfo_ms", "steady_ms", "peak_rss_mb", "session_ms")
                         if ours.get(k) and ort.get(k)}
        a, b = np.array(raw["ours"][0]["output_head"]), np.array(raw["ort"][0]["output_head"])
        res["first_output_max_abs_diff"] = float(np.abs(a - b).max()) if a.shape == b.shape and a.size else None
    return res


def format_table(res: dict) -> str:
    cells = [["", *[h for h, _, _ in COLUMNS]]]
    for r in res["rows"]:
        cells.append([r["runtime"], *[_fmt(r.get(k), s) for _, k, s in COLUMNS]])
    if "ratios" in res:
        cells.append(["ours/onnxruntime", *[_fmt(res["ratios"].get(k), ".2f") + ("x" if k in res["ratios"] else "")
                                            for _, k, _ in COLUMNS]])
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(len(c)))
             for c in cells]
    lines.append(f"{res['page_cache']} page cache, {res['reps']} interleaved fresh processes per runtime (medians), "
                 f"prompt {res['tokens']} tokens, prepared cache {res['policy']}; load average "
                 f"{' '.join(str(x) for x in res['load_avg'])} on {res['cpu_count']} cores")
    lines.append("TTFO: process spawn to the first run's outputs; session/first run: its phases; read*/prepack*: "
                 "summed task time until then (overlapped with the run); ready: until fully prepared; steady: "
                 "median run afterwards")
    if res.get("first_output_max_abs_diff") is not None:
        lines.append(f"first output vs onnxruntime (its first 8 values): max |difference| "
                     f"{res['first_output_max_abs_diff']:.2g}")
    return "\n".join(lines)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, spec)
