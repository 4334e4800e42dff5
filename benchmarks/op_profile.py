"""Where a corpus model's steady-state run spends its time, op by op: ours and onnxruntime side by side.

Ours: ``RuntimeSession.trace_actions`` (a callback after every action's kernel) on the prepared session;
each node's time is the median over ``--reps`` runs, summed per op type. onnxruntime: its own profiler
(``enable_profiling``), the median ``*_kernel_time`` per node, summed per op type (after its graph
optimisations: its op names are its fused kernels, e.g. ``FusedConv``, NCHWc ``Conv``, ``ReorderInput``).
Medians per node keep one-off stalls of a shared machine out; the load average is printed.

``--threads`` sets both runtimes' intra-op threads; ``--cpu`` times our actions by thread CPU time
(with ``--threads 1`` the time each kernel computes, not the scheduler's; onnxruntime's profiler stays wall).

    python -m benchmarks.op_profile [--models resnet18,mobilenet_v3,lraspp] [--reps 30] [--top 8] [--threads 1]
                                    [--cpu] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

if __package__:  # python -m benchmarks.op_profile
    from benchmarks import _common as C
    from benchmarks.models import _build
else:  # python benchmarks/op_profile.py
    import _common as C
    from models import _build

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.helpers


def profile_ours(path: str, feeds: dict, reps: int, threads: int = 0,
                 clock=time.perf_counter) -> dict[str, tuple[float, int]]:
    """op type -> (ms per run, nodes), from medians per action (``threads`` 0: every core)."""
    from onnx_prepared import SessionOptions
    from onnx_prepared.runtime import RuntimeSession

    so = SessionOptions()
    so.intra_op_num_threads = threads
    with RuntimeSession(path, so) as s:
        s.prepare()
        for _ in range(3):
            s.run(feeds)
        plan = s.plan.execution
        times: dict[int, list[float]] = collections.defaultdict(list)
        last = [0.0]

        def after(i: int) -> None:
            t = clock()
            times[i].append(t - last[0])
            last[0] = t

        with s.trace_actions(after):
            for _ in range(reps):
                last[0] = clock()
                s.run(feeds)
    per_op: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for i, ts in times.items():
        label = plan.node_labels[plan.actions[i].node_index]
        op = label.rsplit("(", 1)[-1].rstrip(")")
        per_op[op][0] += statistics.median(ts) * 1e3
        per_op[op][1] += 1
    return {k: (v[0], v[1]) for k, v in per_op.items()}


def profile_ort(path: str, feeds: dict, reps: int, threads: int = 0) -> dict[str, tuple[float, int]]:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = threads
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for _ in range(3 + reps):
            s.run(None, feeds)
        with open(s.end_profiling()) as f:
            events = json.load(f)
    times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            times[(e["name"], e.get("args", {}).get("op_name", "?"))].append(e["dur"] / 1e3)
    per_op: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for (_, op), ts in times.items():
        per_op[op][0] += statistics.median(ts[3:] or ts)
        per_op[op][1] += 1
    return {k: (v[0], v[1]) for k, v in per_op.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v3,lraspp")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads of both runtimes (0: every core)")
    ap.add_argument("--cpu", action="store_true",
                    help="our actions in thread CPU time (with --threads 1: load-proof; onnxruntime's stay wall)")
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    clock = time.thread_time if args.cpu else time.perf_counter
    folder = os.path.join(args.models_dir, "corpus")
    result = {"benchmark": "op_profile", "machine_before": C.machine(), "models": []}
    for name in C.parse_list(args.models):
        cm = _build(folder, name)
        feeds = cm.feeds[0]
        ours = profile_ours(cm.path, feeds, args.reps, args.threads, clock)
        ort_ = profile_ort(cm.path, feeds, args.reps, args.threads)
        result["models"].append({"model": name, "ours": ours, "ort": ort_})
    result["machine_after"] = C.machine()
    result["top"] = args.top
    C.emit(result, args.json, _print)
    return result


def _print(result: dict) -> None:
    print(f"load average before: {result['machine_before']['load_avg']}, after: {result['machine_after']['load_avg']}")
    for m in result["models"]:
        rows = []
        for side in ("ours", "ort"):
            ops = sorted(m[side].items(), key=lambda kv: -kv[1][0])
            total = sum(v[0] for v in m[side].values())
            rows.append((side, total, ops[:result["top"]]))
        print(f"== {m['model']}: sum of per-node medians, ours {rows[0][1]:.3f} ms, onnxruntime {rows[1][1]:.3f} ms")
        for side, _, ops in rows:
            print(f"  {side:5s} " + ", ".join(f"{op} {ms:.3f} ms x{n}" for op, (ms, n) in ops))


if __name__ == "__main__":
    main(sys.argv[1:])
