"""Time to first output against onnxruntime: process start to the first prefill's logits, phase by phase.

Each measurement is a fresh process, started right after the model's files (and the companion cache's)
were evicted from the page cache (``cold``: ``posix_fadvise(DONTNEED)``, residency checked with
``mincore``) or read once (``warm``). Runtimes, interleaved in rotating order within each repetition, on
the same model and feeds (a prefill of ``--prompts`` tokens):

- ``ort``: ``import onnxruntime``, ``InferenceSession(path, providers=["CPUExecutionProvider"])`` (default
  options), ``run(None, feeds)``
- ``ours``: ``from onnx_prepared import RuntimeSession``, ``RuntimeSession(path)`` (no companion cache:
  ``prepared_model_policy="disabled"``), ``run(feeds)`` (cold path: the run streams weights in as it executes)
- ``ours+cache``: the same with ``read_only`` on a complete companion built beforehand
  (``onnx-prepared cache build``), evicted with the model

Models (``--models``): ``medium`` (tied INT4 embedding: GatherBlockQuantized shared with the LM head) and
``medium-genai`` (onnxruntime-genai's builder shape: an untied float32 embedding read by Gather and a
separate INT4 LM head; ``generate tiny-llm --embedding fp32``).

Per process also its CPU time to the first output (user + system, every thread) and the time its threads
were runnable but waiting for a core (schedstat): on a loaded machine TTFO is mostly that wait, and the CPU
ratio is the figure the load disturbs least. Phases (ms): interpreter start (spawn -> main), ``import
numpy``, import of the runtime, feeds; for ours the session construction split by builder phase: parse
(metadata-only load), companion (open the cache), resolve, plan, state (the rest: session state, producers,
waiting for the background jobs); the first run. Construction's background jobs are timed on their threads:
"bg: early" (read a named companion's index, start streaming its payloads) and sched (create the scheduler).
Points (ms from spawn): first node (the run's first continuation segment starts), last read (the last read
task that finished before the output), output (= TTFO). Plus run compute (summed continuation segments), bytes
read before the output (source + companion payloads) and peak RSS. Unless
``--no-profile``, one more process per model and prompt prepares the model and times our prefill per kernel
(first and second run after ``prepare()``). Goals (issue 12; ratios ours / onnxruntime, cold): TTFO <= 0.5x
at 16 and 128 tokens without a cache, <= 0.45x with a complete cache, a hit never slower than a miss; import
(numpy included) <= 1.1x. Before the first child, onnx_prepared's bytecode is compiled (as installing a
wheel does), so that the import phase times loading our modules, not compiling them (this environment
sets PYTHONDONTWRITEBYTECODE, so an uncompiled tree would be recompiled by every child).

``--ab VAR=VALUE`` adds the rows ``ours/ab`` (and ``ours+cache/ab``): the same children with that
environment variable set, interleaved with the others, for an A/B of a switch under the same load.

    python benchmarks/ttfo.py [--models medium,medium-genai] [--prompts 16,128] [--reps 3] [--json]
                              [--ab ONNX_PREPARED_SOURCE_FORMS=0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
else:  # python benchmarks/NAME.py
    import _common as C

RUNTIMES = ("ort", "ours", "ours+cache")
GOALS = {"ours": 0.5, "ours+cache": 0.45}  # cold TTFO, ours / onnxruntime, at every prompt length
GOAL_IMPORT = 1.1
MODELS = {"medium": {"preset": "medium"}, "medium-genai": {"preset": "medium", "embedding": "fp32"}, "tiny": {}}
STEM = "tiny-llm.prepared.onnx"
_PHASES = ("interp_ms", "numpy_ms", "import_ms", "feeds_ms", "session_ms", "run_ms")
_BUILD_PHASES = (("parse_ms", "load"), ("companion_ms", "open_companion"), ("resolve_ms", "resolve_model"),
                 ("plan_ms", "build_prepared_plan"))
#: construction's background jobs (runtime/builder.py runs them on threads of their own): timed, not in "state"
_BACKGROUND = (("early_ms", "early_read_ahead"), ("sched_ms", "choose_scheduler"))


def model_path(models_dir: str, model: str) -> str:
    """The cached generated model ``model`` (a key of MODELS); ``tiny``/``medium`` are folders others share."""
    if model in ("tiny", "medium"):
        return C.tiny_llm_path(models_dir, model)
    from onnx_prepared.generate import MODEL_FILE, generate_tiny_llm

    out = os.path.join(models_dir, model)
    path = os.path.join(out, MODEL_FILE)
    if not os.path.exists(path):
        print(f"[bench] generating {model!r} into {out} (once)", file=sys.stderr)
        generate_tiny_llm(out, **MODELS[model])
    return path


def build_companion(models_dir: str, model: str, path: str) -> str:
    """A complete companion cache of ``path`` (``cache build``, which tops up an earlier one), verified."""
    out = os.path.join(models_dir, "companions-ttfo", model, STEM)
    for args in (("cache", "build", path, "--out", out, "--quiet"), ("cache", "verify", out, "--model", path)):
        p = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return out


# **** child process ****


def child(a: argparse.Namespace) -> None:
    t_main = time.perf_counter()
    import numpy as np

    t_np = time.perf_counter()
    if a.child == "ort":
        import onnxruntime as ort

        t_imp = time.perf_counter()
        feeds = C.llm_prefill_feeds(a.model, a.tokens)
        t_feeds = time.perf_counter()
        sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
        t_sess = time.perf_counter()
        out = sess.run(None, feeds)
        t_out = time.perf_counter()
        extra: dict = {}
    else:
        from onnx_prepared import RuntimeSession

        t_imp = time.perf_counter()
        feeds = C.llm_prefill_feeds(a.model, a.tokens)
        phases = _time_build_phases()
        t_feeds = time.perf_counter()
        opts = {"trace": True, "prepared_model_policy": "disabled"}
        if a.companion:
            opts.update(prepared_model_policy="read_only", prepared_model_path=a.companion)
        sess = RuntimeSession(a.model, opts)
        t_sess = time.perf_counter()
        out = sess.run(feeds)
        t_out = time.perf_counter()
        st, ps = sess.state, sess.companion
        read_mb = (st.reader.reader.bytes_read + (ps.bytes_read if ps is not None else 0)) / C.MB
        extra = {**_ours_breakdown(sess, t_sess, t_out, a.spawn), "read_mb_before_output": read_mb,
                 **{k: v * 1e3 for k, v in phases.items()}}
        extra["state_ms"] = (t_sess - t_feeds) * 1e3 - sum(extra.get(k, 0.0) for k, _ in _BUILD_PHASES)
        sess.close()
    cpu_ms, runq_ms = _cpu_and_runqueue_ms()
    logits = np.asarray(out[0])[0, -1]
    C.child_print({
        "cpu_ms": cpu_ms,
        "runq_ms": runq_ms,
        "runtime": a.child,
        "interp_ms": (t_main - a.spawn) * 1e3,
        "numpy_ms": (t_np - t_main) * 1e3,
        "import_ms": (t_imp - t_np) * 1e3,
        "feeds_ms": (t_feeds - t_imp) * 1e3,
        "session_ms": (t_sess - t_feeds) * 1e3,
        "run_ms": (t_out - t_sess) * 1e3,
        "ttfo_ms": (t_out - a.spawn) * 1e3,
        "peak_rss_mb": C.max_rss_mb(),
        "argmax": int(logits.argmax()),
        "logits_head": [float(x) for x in logits[:4]],
        **extra,
    })


def _cpu_and_runqueue_ms() -> tuple[float, float | None]:
    """(CPU time of this process so far, user + system; time its live threads spent runnable but waiting
    for a core, ``/proc/self/task/*/schedstat``, None where there is none), in ms.

    NOTE: on a loaded machine the TTFO is mostly the wait for a core: both figures say how much of a
    time is work and how much is the machine's load (a CPU-bound process under fair sharing finishes in
    about cpu / its share of the cores).
    """
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    wait = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    wait += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    except OSError:
        return (r.ru_utime + r.ru_stime) * 1e3, None
    return (r.ru_utime + r.ru_stime) * 1e3, wait / 1e6


def _time_build_phases() -> dict[str, float]:
    """Seconds per construction phase: wraps the phase functions runtime/builder.py calls by name."""
    from onnx_prepared.runtime import builder

    spent: dict[str, float] = {}
    for key, name in _BUILD_PHASES + _BACKGROUND:
        fn = getattr(builder, name)

        def timed(*args, _fn=fn, _key=key, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_key] = spent.get(_key, 0.0) + time.perf_counter() - t0

        setattr(builder, name, timed)
    return spent


def child_profile(a: argparse.Namespace) -> None:
    """Per-kernel time of our prefill (after prepare), first and second run in this process."""
    import re
    from collections import Counter

    from onnx_prepared.runtime.session import RuntimeSession

    feeds = C.llm_prefill_feeds(a.model, a.tokens)
    sess = RuntimeSession(a.model)
    t0 = time.perf_counter()
    sess.prepare()
    prepare_ms = (time.perf_counter() - t0) * 1e3
    blas = _hot_blas_threads(sess)
    ex = sess.plan.execution
    template = ex.new_values()
    for r, slot in zip(sess.plan.requirements, sess.plan.requirement_slots):
        if slot >= 0:
            template[slot] = sess.store.get(r.key)
    slot_of = {ex.slot_names[s]: s for s in ex.input_slots}
    runs = []
    for _ in range(2):
        values = template.copy()
        for n, v in feeds.items():
            values[slot_of[n]] = v
        per: Counter[str] = Counter()
        last = [time.perf_counter()]

        def on_step(act, _values, per=per, last=last):
            now = time.perf_counter()
            per[re.sub(r"-k\d+-n\d+$", "", act.kernel.name)] += now - last[0]
            last[0] = now

        t0 = last[0] = time.perf_counter()
        ex.replay(values, on_step=on_step)
        total = (time.perf_counter() - t0) * 1e3
        runs.append({"total_ms": total, "by_kernel_ms": {k: v * 1e3 for k, v in per.items()}})
    sess.close()
    C.child_print({"prepare_ms": prepare_ms, "blas_threads": blas, "first": runs[0], "second": runs[1]})


def _hot_blas_threads(sess) -> int | None:
    """Give OpenBLAS the thread count the session's hot path uses (the replay here bypasses the session).

    NOTE: without it the replay runs with OpenBLAS's default (one thread per core), which on this loaded
    2-core machine measured 4x slower than the runtime's own single-threaded setting.
    """
    try:
        from onnx_prepared.kernels import _blas
    except ImportError:
        return None
    n = getattr(sess, "blas_threads", None)
    _blas.set_threads(n)
    return n if n is not None else _blas.default_threads()


def _ours_breakdown(sess, t0: float, t1: float, spawn: float) -> dict:
    """Split the first run: continuation compute vs waiting, and the loading work done meanwhile."""
    recs = [r for r in sess.scheduler.trace.records() if r.started <= t1]
    runs = sorted((r for r in recs if r.name.startswith("I.run")), key=lambda r: r.started)
    reads = [r for r in recs if r.name.endswith((".read_source", ".read_packed"))]
    packs = [r for r in recs if r.name.endswith(".prepack")]
    busy = sum(r.finished - r.started for r in runs)
    done = [r.finished for r in reads if r.finished <= t1]
    return {
        "first_node_at_ms": (runs[0].started - spawn) * 1e3 if runs else None,
        "last_read_at_ms": (max(done) - spawn) * 1e3 if done else None,
        "run_compute_ms": busy * 1e3,
        "run_wait_ms": ((t1 - t0) - busy) * 1e3,
        "yields": sess.counters["yields"],
        "read_sum_ms": sum(min(r.finished, t1) - r.started for r in reads) * 1e3,
        "prepack_sum_ms": sum(min(r.finished, t1) - r.started for r in packs) * 1e3,
        "reads_done": sum(1 for r in reads if r.finished <= t1),
        "prepacks_done": sum(1 for r in packs if r.finished <= t1),
    }


# **** parent ****


def compile_package(ab: str | None = None) -> None:
    """Write onnx_prepared's .pyc files, as ``pip install`` of a wheel does (children only read them): the
    package this process imports and, for ``--ab PYTHONPATH=...``, the one under each folder of that path.

    NOTE: without the second, an A/B of two trees timed the /ab tree's bytecode compilation: this
    environment sets PYTHONDONTWRITEBYTECODE, so a tree whose .pyc are missing or stale (main after a
    merge) is compiled again by every child, in its import and construction phases.
    """
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("onnx_prepared")
    folders = list(spec.submodule_search_locations) if spec is not None and spec.submodule_search_locations else []
    var, _, value = (ab or "").partition("=")
    if var == "PYTHONPATH":
        folders += [os.path.join(f, "onnx_prepared") for f in value.split(os.pathsep) if f]
    for folder in dict.fromkeys(folders):
        if os.path.isdir(folder):
            compileall.compile_dir(folder, quiet=1)


def bench(a: argparse.Namespace) -> dict:
    me = os.path.abspath(__file__)
    compile_package(a.ab)
    res: dict = {"benchmark": "ttfo", "machine": C.machine(), "reps": a.reps, "goals": GOALS,
                 "goal_import": GOAL_IMPORT, "cases": []}
    raw: dict[tuple, list[dict]] = {}
    resident: dict[str, list[float]] = {"cold": [], "warm": []}
    paths = {m: model_path(a.models_dir, m) for m in a.models}
    companions = {m: build_companion(a.models_dir, m, paths[m]) for m in a.models if "ours+cache" in a.runtimes}
    runtimes = list(a.runtimes)
    if a.ab:
        runtimes += [f"{rt}/ab" for rt in a.runtimes if rt != "ort"]
        res["ab"] = a.ab
    for rep in range(a.reps):
        for model in a.models:
            files = C.model_files(paths[model])
            if model in companions:
                folder = os.path.dirname(companions[model])
                files += [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith((".onnx", ".data"))]
            for tokens in a.prompts:
                for cache in a.caches:
                    for rt in C.rotate(runtimes, rep):
                        frac = C.set_cache(files, cache)
                        if frac is not None:
                            resident[cache].append(frac)
                        args = [me, "--child", "ort" if rt == "ort" else "ours", "--model", paths[model],
                                "--tokens", str(tokens)]
                        if rt.startswith("ours+cache"):
                            args += ["--companion", companions[model]]
                        env = dict([a.ab.split("=", 1)]) if rt.endswith("/ab") else {}
                        raw.setdefault((model, tokens, cache, rt), []).append(C.run_child(args, env))
    for (model, tokens, cache, rt), runs in raw.items():
        row: dict = {"model": model, "tokens": tokens, "cache": cache, "runtime": rt, "n": len(runs)}
        for k in runs[0]:
            vals = [r[k] for r in runs if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
            if vals and k != "argmax":
                row[k] = C.median(vals)
        row["import_total_ms"] = C.median([r["numpy_ms"] + r["import_ms"] for r in runs])
        row["argmax"] = runs[0]["argmax"]
        res["cases"].append(row)
    by = {(r["model"], r["tokens"], r["cache"], r["runtime"]): r for r in res["cases"]}
    for r in res["cases"]:
        base = by.get((r["model"], r["tokens"], r["cache"], "ort"))
        if base is not None and r["runtime"] != "ort":
            r["vs_ort"] = r["ttfo_ms"] / base["ttfo_ms"]
            r["cpu_vs_ort"] = r["cpu_ms"] / base["cpu_ms"] if base.get("cpu_ms") else None
            r["import_vs_ort"] = r["import_total_ms"] / base["import_total_ms"]
            r["goal"] = GOALS.get(r["runtime"].removesuffix("/ab"))
            r["meets_goal"] = r["vs_ort"] <= r["goal"] if r["goal"] and r["cache"] == "cold" else None
            r["same_argmax"] = r["argmax"] == base["argmax"]
            r["delta_ms"] = {p: r[p] - base[p] for p in _PHASES}
        ab = r["runtime"].endswith("/ab")
        miss = by.get((r["model"], r["tokens"], r["cache"], "ours/ab" if ab else "ours"))
        if r["runtime"].startswith("ours+cache") and miss is not None:
            r["hit_vs_miss"] = r["ttfo_ms"] / miss["ttfo_ms"]
    res["resident_before"] = {k: ([round(min(v), 4), round(max(v), 4)] if v else None) for k, v in resident.items()}
    if a.profile:
        res["profile"] = []
        for model in a.models:
            C.warm(C.model_files(paths[model]))
            for tokens in a.prompts:
                p = C.run_child([me, "--child", "profile", "--model", paths[model], "--tokens", str(tokens)], {})
                ort_run = by.get((model, tokens, "warm", "ort"), {}).get("run_ms")
                res["profile"].append({"preset": model, "tokens": tokens, "ort_first_run_ms": ort_run, **p})
    return res


def print_table(res: dict) -> None:
    m = res["machine"]
    print(f"time to first output, process start -> first prefill logits (medians of {res['reps']} fresh processes, "
          f"interleaved; cpus={m['cpu_count']} load={m['load_avg']})")
    rb = res["resident_before"]
    if rb.get("cold"):
        print(f"page cache resident before cold runs: {rb['cold'][0]:.1%}..{rb['cold'][1]:.1%}"
              + ("  WARNING: eviction did not work" if rb["cold"][1] > 0.05 else ""))
    for r in res["cases"]:
        r["case"] = f"{r['model']} {r['tokens']}tok {r['cache']}"
    print(C.table(res["cases"], [
        ("case", "case", ""), ("runtime", "runtime", ""), ("interp", "interp_ms", ".0f"), ("numpy", "numpy_ms", ".0f"),
        ("import", "import_ms", ".0f"), ("session", "session_ms", ".0f"), ("first run", "run_ms", ".0f"),
        ("TTFO ms", "ttfo_ms", ".0f"), ("vs ort", "vs_ort", ".2f"), ("goal", "goal", ".2f"),
        ("CPU ms", "cpu_ms", ".0f"), ("CPU vs ort", "cpu_vs_ort", ".2f"), ("runq ms", "runq_ms", ".0f"),
        ("meets", "meets_goal", ""), ("hit/miss", "hit_vs_miss", ".2f"), ("same argmax", "same_argmax", ""),
        ("import+numpy", "import_total_ms", ".0f"), ("import vs ort", "import_vs_ort", ".2f"),
        ("peak RSS MB", "peak_rss_mb", ".0f"),
    ]))
    ours = [r for r in res["cases"] if r["runtime"] != "ort"]
    if ours:
        print(f"\nours, phase by phase (ms; 'at' = ms from process spawn); import goal <= {res['goal_import']}x")
        for r in ours:
            d = r.get("delta_ms") or {}
            r["d_import"], r["d_session"], r["d_run"] = d.get("import_ms"), d.get("session_ms"), d.get("run_ms")
        print(C.table(ours, [
            ("case", "case", ""), ("runtime", "runtime", ""), ("bg: early", "early_ms", ".0f"),
            ("sched", "sched_ms", ".0f"), ("parse", "parse_ms", ".0f"),
            ("companion", "companion_ms", ".0f"), ("resolve", "resolve_ms", ".0f"), ("plan", "plan_ms", ".0f"),
            ("state", "state_ms", ".0f"), ("first node at", "first_node_at_ms", ".0f"),
            ("last read at", "last_read_at_ms", ".0f"), ("output at", "ttfo_ms", ".0f"),
            ("run compute", "run_compute_ms", ".0f"), ("run wait", "run_wait_ms", ".0f"),
            ("MB read", "read_mb_before_output", ".1f"), ("read sum", "read_sum_ms", ".0f"),
            ("prepack sum", "prepack_sum_ms", ".0f"),
            ("vs ort: import", "d_import", "+.0f"), ("session", "d_session", "+.0f"), ("first run", "d_run", "+.0f"),
        ]))
    print_profile(res)


def print_profile(res: dict, top: int = 6) -> None:
    prof = res.get("profile")
    if not prof:
        return
    print("\nour prefill by kernel after prepare() (fresh process, warm cache, the hot path's BLAS "
          "threads): first and second run, ms")
    for p in prof:
        first, second = p["first"], p["second"]
        ort = p.get("ort_first_run_ms")
        print(f"{p['preset']} {p['tokens']}tok: prepare {p['prepare_ms']:.0f}; run 1 {first['total_ms']:.0f}, "
              f"run 2 {second['total_ms']:.0f}" + (f" (onnxruntime's first run: {ort:.0f})" if ort else ""))
        ks = sorted(first["by_kernel_ms"], key=lambda k: -first["by_kernel_ms"][k])[:top]
        rows = [{"kernel": k, "first": first["by_kernel_ms"][k], "second": second["by_kernel_ms"].get(k),
                 "share": first["by_kernel_ms"][k] / first["total_ms"]} for k in ks]
        print(C.table(rows, [("  kernel", "kernel", ""), ("run 1 ms", "first", ".0f"), ("run 2 ms", "second", ".0f"),
                             ("share of run 1", "share", ".0%")]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--models", type=C.parse_list, default=["medium", "medium-genai"],
                    help=f"comma-separated generated models among {', '.join(MODELS)} (default medium,medium-genai)")
    ap.add_argument("--prompts", type=lambda s: [int(x) for x in C.parse_list(s)], default=[16, 128],
                    help="prompt lengths (default 16,128)")
    ap.add_argument("--caches", type=C.parse_list, default=["cold"], help="page-cache states: cold,warm")
    ap.add_argument("--runtimes", type=C.parse_list, default=list(RUNTIMES))
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per row (median reported)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the per-kernel profile of our prefill (one extra process per preset and prompt)")
    ap.add_argument("--ab", metavar="VAR=VALUE",
                    help="also run ours (and ours+cache) with this environment variable set: rows ours/ab")
    ap.add_argument("--child", choices=["ort", "ours", "profile"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--companion", help=argparse.SUPPRESS)
    ap.add_argument("--spawn", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child == "profile":
        child_profile(a)
        return 0
    if a.child:
        child(a)
        return 0
    bad = ([c for c in a.caches if c not in ("cold", "warm")] + [r for r in a.runtimes if r not in RUNTIMES]
           + [m for m in a.models if m not in MODELS])
    if a.ab is not None and "=" not in a.ab:
        ap.error(f"--ab {a.ab!r}: expected VAR=VALUE")
    if bad or a.reps < 1 or not a.prompts or min(a.prompts) < 1:
        ap.error(f"bad caches/runtimes/models {bad} or non-positive reps/prompts")
    if "ort" in a.runtimes:
        import importlib.util

        if importlib.util.find_spec("onnxruntime") is None:
            ap.error("onnxruntime is not installed (pip install onnxruntime), or pass --runtimes ours")
    C.emit(bench(a), a.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
