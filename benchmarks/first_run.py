"""Where the first run after a cache hit spends its time: per kernel, first (cold path) vs second (hot) run.

One fresh process per trial, model and companion evicted from the page cache first (``--cache cold``)
or left resident (``warm``). Each kernel call is timed (wall and the calling thread's CPU), and every
thread's CPU time (``/proc/self/task/*/schedstat``: run time, and time runnable but waiting for a core)
is sampled around the constructor and both runs, so a first run that is slower than the hot one shows
whether its compute thread computes more, waits for a core (I/O workers hashing and populating beside
it on 2 cores), or waits for reads. Diagnostic only: it prints one table per trial, no ratios.

    python -m benchmarks.first_run --models-dir /work/ttfo-models --companion DIR/tiny-llm.prepared.onnx
                                   [--model medium] [--tokens 16] [--cache cold] [--trials 3]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
else:  # python benchmarks/NAME.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import _common as C


def _threads() -> dict[int, tuple[int, int]]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[int(t)] = (int(run), int(wait))
        except (OSError, ValueError):
            pass
    return out


def _thread_delta(a: dict, b: dict) -> dict[str, tuple[float, float]]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    res = {}
    for k, (run, wait) in b.items():
        r0, w0 = a.get(k, (0, 0))
        if run - r0 > 500_000:
            res[f"{names.get(k, 'native')}#{k}"] = (round((run - r0) / 1e6, 1), round((wait - w0) / 1e6, 1))
    return res


def child(a: argparse.Namespace) -> None:
    from onnx_prepared import RuntimeSession
    from onnx_prepared.bind import execution_plan as ep

    run_steps = ep._run
    per: dict = defaultdict(lambda: [0.0, 0.0, 0])

    def timed_run(steps, values, plan):
        for s in steps:
            w, c = time.perf_counter(), time.thread_time()
            run_steps((s,), values, plan)
            r = per[re.sub(r"-k\d+-n\d+$", "", s[-1].kernel.name)]
            r[0] += time.perf_counter() - w
            r[1] += time.thread_time() - c
            r[2] += 1

    ep._run = timed_run
    feeds = C.llm_prefill_feeds(a.model, a.tokens)
    opts = {"prepared_model_policy": "read_only", "prepared_model_path": a.companion} if a.companion else {
        "prepared_model_policy": "disabled"}
    s0, t0 = _threads(), time.perf_counter()
    sess = RuntimeSession(a.model, opts)
    s1, t1 = _threads(), time.perf_counter()
    runs = []
    for _ in range(2):
        per.clear()
        t = time.perf_counter()
        sess.run(feeds)
        runs.append((time.perf_counter() - t, {k: list(v) for k, v in per.items()}, _threads()))
    sess.close()
    print(f"session {1e3 * (t1 - t0):.1f} ms, threads (cpu, runnable-waiting ms): {_thread_delta(s0, s1)}")
    prev = s1
    for i, (wall, _, snap) in enumerate(runs):
        print(f"run {i + 1} {1e3 * wall:.1f} ms, threads: {_thread_delta(prev, snap)}")
        prev = snap
    first, second = runs[0][1], runs[1][1]
    print(f"{'kernel':48s} {'n':>4s} {'1st wall':>9s} {'1st cpu':>8s} {'2nd wall':>9s} {'2nd cpu':>8s}")
    for k in sorted(first, key=lambda k: -first[k][0])[: a.top]:
        f, s = first[k], second.get(k, [0.0, 0.0, 0])
        print(f"{k[:48]:48s} {f[2]:4d} {1e3 * f[0]:9.2f} {1e3 * f[1]:8.2f} {1e3 * s[0]:9.2f} {1e3 * s[1]:8.2f}")
    tot = [sum(v[i] for v in r.values()) * 1e3 for r in (first, second) for i in (0, 1)]
    print(f"{'all kernels':48s} {'':4s} {tot[0]:9.2f} {tot[1]:8.2f} {tot[2]:9.2f} {tot[3]:8.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--model", default="medium", help="a folder of --models-dir holding tiny-llm.onnx")
    ap.add_argument("--companion", default=None, help="a complete companion (.prepared.onnx); none: no cache")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.model = os.path.join(a.models_dir, a.model, "tiny-llm.onnx")
    if a.companion and a.companion.lower() == "none":
        a.companion = None
    if a.child:
        child(a)
        return 0
    C.compile_package()  # children import compiled modules, as from an installed wheel
    files = glob.glob(os.path.join(os.path.dirname(a.model), "*"))
    if a.companion:
        files += glob.glob(os.path.join(os.path.dirname(a.companion), "*"))
    for i in range(a.trials):
        frac = C.set_cache(files, a.cache)
        print(f"== trial {i + 1} ({a.cache}, {frac:.1%} resident), load {os.getloadavg()[0]:.2f}")
        sys.stdout.flush()
        cmd = [sys.executable, "-m", "benchmarks.first_run", *(argv if argv is not None else sys.argv[1:]), "--child"]
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
