"""One measured cold start, run as a script in a fresh process by ``onnx-prepared bench``.

Only the standard library is imported before the clock starts: the phases (interpreter, numpy, runtime
import, session creation, first run) are timed from the process's spawn. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _peak_rss_mb() -> float:
    """``VmHWM`` of this process (``ru_maxrss`` would inherit the parent's peak across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runtime", choices=["ours", "ort"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--feeds", required=True)
    p.add_argument("--spawn", type=float, required=True)
    p.add_argument("--steady", type=int, default=5)
    p.add_argument("--trace", default=None)
    p.add_argument("--policy", default="disabled")
    p.add_argument("--cache-path", default=None)
    a = p.parse_args()
    t_main = time.perf_counter()
    import numpy as np

    t_np = time.perf_counter()
    extra: dict = {}
    if a.runtime == "ort":
        import onnxruntime as ort

        t_imp = time.perf_counter()
        with np.load(a.feeds) as z:
            feeds = {k: z[k] for k in z.files}
        t_feeds = time.perf_counter()
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
        t_sess = time.perf_counter()
        out = sess.run(None, feeds)
        t_out = time.perf_counter()
        run = lambda: sess.run(None, feeds)  # noqa: E731
        t_ready = t_out
    else:
        from onnx_prepared.runtime import RuntimeSession

        t_imp = time.perf_counter()
        with np.load(a.feeds) as z:
            feeds = {k: z[k] for k in z.files}
        t_feeds = time.perf_counter()
        opts = {"trace": True, "prepared_model_policy": a.policy, "prepared_model_path": a.cache_path}
        sess = RuntimeSession(a.model, opts)
        t_sess = time.perf_counter()
        out = sess.run(feeds)
        t_out = time.perf_counter()
        sess.prepare()  # steady state is the hot path: every prepared object resident
        t_ready = time.perf_counter()
        run = lambda: sess.run(feeds)  # noqa: E731
        extra = _phases(sess.scheduler.trace, t_sess, t_out)
        if a.trace:
            _save_trace(sess.scheduler.trace, a.trace, t_feeds, t_out)
    steady = []
    for _ in range(a.steady):
        t = time.perf_counter()
        run()
        steady.append(time.perf_counter() - t)
    first = np.asarray(out[0])
    print(json.dumps({
        "runtime": a.runtime,
        "interp_ms": (t_main - a.spawn) * 1e3,
        "numpy_ms": (t_np - t_main) * 1e3,
        "import_ms": (t_imp - t_np) * 1e3,
        "session_ms": (t_sess - t_feeds) * 1e3,
        "first_run_ms": (t_out - t_sess) * 1e3,
        "ttfo_ms": (t_out - a.spawn) * 1e3 - (t_feeds - t_imp) * 1e3,  # feeds loading is not the runtime's
        "ready_ms": (t_ready - t_feeds) * 1e3,
        "steady_ms": sorted(steady)[len(steady) // 2] * 1e3 if steady else None,
        "peak_rss_mb": _peak_rss_mb(),
        "output_head": [float(x) for x in first.reshape(-1)[:8]],
        **extra,
    }))
    sys.stdout.flush()


def _phases(trace, t0: float, t1: float) -> dict:
    """Summed task time by kind up to the first output, and how long the first run computed vs waited."""
    recs = [r for r in trace.records() if r.started <= t1]
    busy = sum(r.finished - r.started for r in recs if r.name.startswith("I."))
    kinds: dict[str, float] = {}
    for r in recs:
        k = task_kind(r.name)
        kinds[k] = kinds.get(k, 0.0) + min(r.finished, t1) - r.started
    return {"read_ms": kinds.get("read", 0.0) * 1e3, "prepack_ms": kinds.get("prepack", 0.0) * 1e3,
            "run_compute_ms": busy * 1e3, "run_wait_ms": max(0.0, (t1 - t0) - busy) * 1e3}


def task_kind(name: str) -> str:
    """read / prepack / persist / publish / inference / other, from a plan task's name."""
    if name.startswith("I."):
        return "inference"
    tail = name.rsplit(".", 1)[-1]
    if tail in ("read_source", "read_packed", "restore"):
        return "read"
    if tail == "prepack":
        return "prepack"
    if tail in ("persist", "flush"):
        return "persist"
    if tail == "publish":
        return "publish"
    return "other"


def _save_trace(trace, path: str, t_session: float, t_out: float) -> None:
    """The Chrome trace plus the session-creation and first-output moments (instant events)."""
    doc = trace.to_chrome()
    pid = os.getpid()
    for name, t in (("session start", t_session), ("first output", t_out)):
        doc["traceEvents"].append({"name": name, "ph": "i", "s": "g", "pid": pid, "tid": 0,
                                   "ts": (t - trace.origin) * 1e6})
    with open(path, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
