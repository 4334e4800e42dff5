"""Scheduler overhead vs concurrent.futures.ThreadPoolExecutor, side by side in one run.

Measures, for the RuntimeScheduler (dependency, priority, slot and memory bookkeeping included) and for a
ThreadPoolExecutor with the same number of workers (which does none of it):

* empty-task throughput: N independent no-op tasks, per-task wall time;
* DAG: a random layered DAG of no-op tasks; the executor runs it in topological waves (submit a wave, wait),
  the scheduler gets the whole graph in one submission;
* submit-to-start latency of one task on an idle pool (median and p90 over many trials);
* ready-queue delay under load: time from ready (executor: submitted) to started, with a backlog of small tasks;
* critical latency under a background flood: one urgent task submitted behind a backlog of background work.

Each figure is the best of ``--repeat`` alternating runs. Prints a table, or one JSON object with ``--json``.

    python benchmarks/scheduler.py [--n 20000] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

from onnx_prepared.scheduler import CpuExecutor, Priority, RuntimeScheduler, Task

WORKERS = 2


def _noop(*_a):
    return None


def _spin(n: int) -> None:
    x = 0
    for i in range(n):
        x += i


def make_dag(n: int, seed: int = 0) -> list[list[int]]:
    """Layered random DAG: ~sqrt(n) layers, each node depends on up to 3 nodes of the previous layers."""
    rng = random.Random(seed)
    width = max(1, int(n ** 0.5))
    deps: list[list[int]] = []
    for i in range(n):
        layer = i // width
        lo, hi = max(0, (layer - 2) * width), layer * width
        deps.append(rng.sample(range(lo, hi), min(hi - lo, rng.randint(0, 3))) if hi > lo else [])
    return deps


def waves(deps: list[list[int]]) -> list[list[int]]:
    level = [0] * len(deps)
    for i, ds in enumerate(deps):
        level[i] = 1 + max((level[d] for d in ds), default=-1)
    out: list[list[int]] = [[] for _ in range(max(level) + 1)]
    for i, lv in enumerate(level):
        out[lv].append(i)
    return out


# **** measurements ****


def tpe_throughput(ex: ThreadPoolExecutor, n: int) -> float:
    t0 = time.perf_counter()
    wait([ex.submit(_noop) for _ in range(n)])
    return (time.perf_counter() - t0) / n


def sched_throughput(s: RuntimeScheduler, n: int) -> float:
    t0 = time.perf_counter()
    s.submit([Task(_noop) for _ in range(n)]).wait()
    return (time.perf_counter() - t0) / n


def tpe_dag(ex: ThreadPoolExecutor, deps: list[list[int]], wv: list[list[int]]) -> float:
    t0 = time.perf_counter()
    for w in wv:
        wait([ex.submit(_noop) for _ in w])
    return (time.perf_counter() - t0) / len(deps)


def sched_dag(s: RuntimeScheduler, deps: list[list[int]]) -> float:
    t0 = time.perf_counter()
    tasks: list[Task] = []
    for ds in deps:
        tasks.append(Task(_noop, deps=[tasks[d] for d in ds]))
    s.submit(tasks).wait()
    return (time.perf_counter() - t0) / len(deps)


def _latencies(submit_one, trials: int) -> list[float]:
    out = []
    for _ in range(trials):
        box: list[float] = []
        t0 = time.perf_counter()
        submit_one(box)
        out.append(box[0] - t0)
    return out


def tpe_latency(ex: ThreadPoolExecutor, trials: int) -> list[float]:
    return _latencies(lambda box: ex.submit(lambda: box.append(time.perf_counter())).result(), trials)


def sched_latency(s: RuntimeScheduler, trials: int) -> list[float]:
    return _latencies(lambda box: s.submit([Task(lambda t: box.append(time.perf_counter()))]).wait(), trials)


def tpe_queue_delay(ex: ThreadPoolExecutor, n: int, spin: int) -> list[float]:
    starts = [0.0] * n
    subs = [0.0] * n

    def body(i: int) -> None:
        starts[i] = time.perf_counter()
        _spin(spin)

    fs = []
    for i in range(n):
        subs[i] = time.perf_counter()
        fs.append(ex.submit(body, i))
    wait(fs)
    return [a - b for a, b in zip(starts, subs)]


def sched_queue_delay(s: RuntimeScheduler, n: int, spin: int) -> list[float]:
    tr = s.enable_trace()
    tr.clear()
    s.submit([Task(lambda t: _spin(spin), name="load") for _ in range(n)]).wait()
    recs = tr.records()
    tr.clear()
    return [r.started - r.queued for r in recs if r.name == "load"]


def tpe_critical_under_flood(ex: ThreadPoolExecutor, n_bg: int, spin: int) -> float:
    fs = [ex.submit(_spin, spin) for _ in range(n_bg)]
    box: list[float] = []
    t0 = time.perf_counter()
    fs.append(ex.submit(lambda: box.append(time.perf_counter())))
    wait(fs)
    return box[0] - t0


def sched_critical_under_flood(s: RuntimeScheduler, n_bg: int, spin: int) -> float:
    hb = s.submit([Task(lambda t: _spin(spin), priority=Priority.BACKGROUND) for _ in range(n_bg)])
    box: list[float] = []
    t0 = time.perf_counter()
    s.submit([Task(lambda t: box.append(time.perf_counter()), priority=Priority.CRITICAL)]).wait()
    hb.wait()
    return box[0] - t0


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def run(n: int, repeat: int) -> dict:
    deps = make_dag(n)
    wv = waves(deps)
    res: dict[str, dict[str, float]] = {}

    def best(key: str, tpe_fn, sched_fn) -> None:
        a, b = [], []
        for _ in range(repeat):  # alternate so machine load hits both sides alike
            a.append(tpe_fn())
            b.append(sched_fn())
        res[key] = {"executor": min(a), "scheduler": min(b)}

    cpu = CpuExecutor(WORKERS, critical_reserved=1)  # leased by the scheduler, closed by its owner (here)
    with cpu, ThreadPoolExecutor(WORKERS) as ex, RuntimeScheduler(cpu=cpu, io_workers=1, io_reserved=0) as s:
        # warm up both pools (threads started, code paths hot)
        tpe_throughput(ex, 2000)
        sched_throughput(s, 2000)
        best("throughput_us_per_task", lambda: tpe_throughput(ex, n) * 1e6, lambda: sched_throughput(s, n) * 1e6)
        best("dag_us_per_task", lambda: tpe_dag(ex, deps, wv) * 1e6, lambda: sched_dag(s, deps) * 1e6)
        trials = max(200, n // 20)
        lat_t, lat_s = [], []
        for _ in range(repeat * trials):  # interleaved one by one: load drift hits both sides alike
            lat_t += tpe_latency(ex, 1)
            lat_s += sched_latency(s, 1)
        res["submit_to_start_us_p50"] = {"executor": statistics.median(lat_t) * 1e6,
                                         "scheduler": statistics.median(lat_s) * 1e6}
        res["submit_to_start_us_p90"] = {"executor": pct(lat_t, 0.9) * 1e6, "scheduler": pct(lat_s, 0.9) * 1e6}
        m = max(500, n // 10)
        qd_t = tpe_queue_delay(ex, m, 200)
        qd_s = sched_queue_delay(s, m, 200)
        res["ready_queue_delay_us_mean"] = {"executor": statistics.fmean(qd_t) * 1e6,
                                            "scheduler": statistics.fmean(qd_s) * 1e6}
        res["ready_queue_delay_us_p99"] = {"executor": pct(qd_t, 0.99) * 1e6, "scheduler": pct(qd_s, 0.99) * 1e6}
        best("critical_under_flood_us", lambda: tpe_critical_under_flood(ex, m, 2000) * 1e6,
             lambda: sched_critical_under_flood(s, m, 2000) * 1e6)
    for v in res.values():
        v["ratio"] = v["scheduler"] / v["executor"] if v["executor"] else float("nan")
    return {
        "n_tasks": n,
        "dag_waves": len(wv),
        "workers": WORKERS,
        "repeat": repeat,
        "python": sys.version.split()[0],
        "threads_alive_after": threading.active_count(),
        "results": res,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="tasks per throughput/DAG run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    out = run(args.n, args.repeat)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"RuntimeScheduler vs ThreadPoolExecutor({WORKERS}), n={out['n_tasks']}, DAG waves={out['dag_waves']}, "
          f"best of {out['repeat']}")
    print(f"{'measure':30} {'executor':>12} {'scheduler':>12} {'ratio':>7}")
    for k, v in out["results"].items():
        print(f"{k:30} {v['executor']:12.2f} {v['scheduler']:12.2f} {v['ratio']:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
