"""Loading and asynchronous-execution benchmark (the spec's "Benchmark" section) on the tiny-llm presets.

Every measurement runs in a fresh process (``--child MODE``), with the model's files evicted from the
page cache (``cold``, checked with ``mincore``) or fully cached (``warm``) just before it starts. Modes,
interleaved in rotating order within each repetition:

- ``stream``: ``RuntimeSession`` then ``run_async(prefill)`` at once (no prepare): the first inference
  overlaps reads and prepacks; then ``prepare()`` until every object is resident.
- ``stream_prefetch``: the same, plus ``prepare_async()`` right after ``run_async``: every producer is
  submitted at once (PREFETCH; the run promotes the ones it waits for). ``run_async`` itself must start
  the producers it binds; ``stream`` matching ``stream_prefetch`` checks that it does (a runtime version
  that only bound them showed one yield per prepared object and no I/O / inference overlap in ``stream``).
- ``prepare``: ``prepare()`` (the scheduler's parallel schedule), then ``run(prefill)`` on the hot path.
- ``sequential``: ``prepare(sequential=True)`` (exactly the same session tasks, one at a time on the
  calling thread), then ``run(prefill)``.
- ``cancel``: ``run_async(prefill)`` on a cold session and ``cancel()`` right after submission; then
  sessions whose first-needed weight read is gated (blocked, released after ``GATE_S`` at the latest)
  so the run is certainly waiting on it, and ``cancel()`` once it has yielded: once with only the run
  wanting that producer, once with ``prepare_async()`` sharing it (C5: the run must not wait for it).

Per run: import time, plan construction (``RuntimeSession(...)``: load_model + resolve + build plan),
reads (count, bytes, summed duration), prepacks (count, summed duration), time to the first executed
inference node and to the first node reading a prepared object, time to first output (TTFO: from session
construction start, and from process start), time until every prepared object is resident, peak RSS,
maximum bytes in flight (reads + prepacks in progress: bytes read, or packed inputs + output) and the
arenas' peak preparation bytes. Read and prepack spans are timed by wrapping the session state's
``reader.read`` and ``prepack`` (the same bodies the scheduler and the sequential path run). The first
executed node (and the first one reading a prepared object) is observed through
``RuntimeSession.trace_actions`` (the plan's kernels wrapped from outside: it fires when an action's kernel
returned); on the hot path (``prepare``/``sequential`` modes) it is the start of ``run``.

The asynchronous figures come from the ``stream`` run's scheduler trace: submission latency
(``run_async`` returning), the run continuation's yields and the time between each yield and its
resume, overlap of loading / prepacking / inference as fractions of the wall time (interval unions),
ready-queue delay (started - queued) per resource, and end-to-end completion.

    python benchmarks/loading.py [--presets tiny,medium] [--reps 3] [--tokens 16] [--models-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import threading
import time

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
else:  # python benchmarks/NAME.py
    import _common as C

MODES = ("stream", "stream_prefetch", "prepare", "sequential")
GATE_S = 2.0  # the gated read is released after this long even if cancel() is still waiting for it


# **** child process ****


def _instrument(sess, spans: list) -> None:
    """Time every payload read and every prepack of ``sess`` (instance-level wrappers)."""
    mr = sess.state.reader
    read = mr.read
    st = sess.state
    prepack = st.prepack
    store = sess.store

    def timed_read(name):
        t0 = time.perf_counter()
        v = read(name)
        spans.append(("read", t0, time.perf_counter(), int(getattr(v, "nbytes", 0))))
        return v

    def timed_prepack(key, gen, entries):
        nb_in = sum(int(getattr(e.value, "nbytes", 0)) for e in entries)
        t0 = time.perf_counter()
        prepack(key, gen, entries)
        spans.append(("prepack", t0, time.perf_counter(), nb_in + store.entry(key).nbytes))

    mr.read = timed_read
    st.prepack = timed_prepack


def _trace_figures(recs, t_sub: float, t_out: float, t_ready: float) -> dict:
    """Asynchronous-execution figures from one traced cold run (times in ms)."""
    runs = sorted((r for r in recs if r.name.startswith("I.run")), key=lambda r: r.started)
    io = [r for r in recs if r.name.startswith("S.") and r.name.endswith(".read_source")]
    packs = [r for r in recs if r.name.startswith("S.") and r.name.endswith(".prepack")]
    waits = [b.started - a.finished for a, b in itertools.pairwise(runs)]
    producer_waits = [b.queued - a.finished for a, b in itertools.pairwise(runs)]
    u_io = C.union((r.started, r.finished) for r in io)
    u_pack = C.union((r.started, r.finished) for r in packs)
    u_inf = C.union((r.started, r.finished) for r in runs)
    out: dict = {"yields": len(waits), "wait_total_ms": sum(waits) * 1e3,
                 "wait_producer_ms": sum(producer_waits) * 1e3,
                 "wait_max_ms": max(waits) * 1e3 if waits else 0.0,
                 "wait_median_ms": C.median(waits) * 1e3 if waits else 0.0,
                 "run_busy_ms": C.length(u_inf) * 1e3}
    for label, lo, hi in (("ready", t_sub, t_ready), ("ttfo", t_sub, t_out)):
        w = hi - lo
        io_, pk, inf = C.clip(u_io, lo, hi), C.clip(u_pack, lo, hi), C.clip(u_inf, lo, hi)
        frac = (lambda u, w=w: C.length(u) / w if w > 0 else float("nan"))  # noqa: E731
        out[f"overlap_{label}"] = {
            "wall_ms": w * 1e3, "io": frac(io_), "prepack": frac(pk), "inference": frac(inf),
            "io&inference": frac(C.intersect(io_, inf)), "prepack&inference": frac(C.intersect(pk, inf)),
            "io&prepack": frac(C.intersect(io_, pk)),
            "any": frac(C.union(io_ + pk + inf)),
        }
    for label, rs in (("io", io), ("prepack", packs), ("run", runs)):
        d = [(r.started - r.queued) * 1e3 for r in rs]
        out[f"queue_{label}_median_ms"] = C.median(d) if d else float("nan")
        out[f"queue_{label}_p95_ms"] = C.pct(d, 0.95)
    out["sched_inflight_mb"] = C.max_concurrent_bytes((r.started, r.finished, r.nbytes) for r in io + packs) / C.MB
    return out


def child(a: argparse.Namespace) -> None:
    t_main = time.perf_counter()
    import numpy  # noqa: F401  (part of the import phase, as for any runtime)

    import onnx_prepared.runtime.session as rs

    t_import = time.perf_counter()
    feeds = C.llm_prefill_feeds(a.model, a.tokens)
    if a.child == "cancel":
        return C.child_print(_child_cancel(a, rs, feeds))
    marks: dict[str, float] = {}
    plan_box: list = []

    def on_action(pc: int) -> None:  # traced actions: note the first executions
        if "first_node" not in marks:
            marks["first_node"] = time.perf_counter()
        if "first_weight_node" not in marks and plan_box[0].action_requirements[pc]:
            marks["first_weight_node"] = time.perf_counter()

    spans: list = []
    t_s0 = time.perf_counter()
    sess = rs.RuntimeSession(a.model, {"trace": True})
    t_s1 = time.perf_counter()
    plan_box.append(sess.plan)
    _instrument(sess, spans)
    tracing = contextlib.ExitStack()  # the child exits after printing: never closed
    tracing.enter_context(sess.trace_actions(on_action))
    res: dict = {"mode": a.child}
    streaming = a.child.startswith("stream")
    if streaming:
        t_sub0 = time.perf_counter()
        h = sess.run_async(feeds)
        t_sub1 = time.perf_counter()
        if a.child == "stream_prefetch":  # every producer submitted now (PREFETCH); the run promotes its own
            prep = sess.prepare_async()
        out = h.result()
        t_out = time.perf_counter()
        if a.child == "stream_prefetch":
            prep.wait()
        sess.prepare()
        t_ready = time.perf_counter()
        t_prep0 = t_sub0
        res["submit_ms"] = (t_sub1 - t_sub0) * 1e3
        res["e2e_ms"] = (t_out - t_sub0) * 1e3
    else:
        t_prep0 = time.perf_counter()
        sess.prepare(sequential=a.child == "sequential")
        t_ready = time.perf_counter()
        marks["first_node"] = marks["first_weight_node"] = t_sub0 = time.perf_counter()
        out = sess.run(feeds)
        t_out = time.perf_counter()
    recs = sess.scheduler.trace.records()
    s_recs = [r for r in recs if r.name.startswith("S.")]
    if s_recs:  # the last publication, not prepare()'s return
        t_ready = min(t_ready, max(r.finished for r in s_recs)) if streaming else t_ready
    assert sess.store.all_resident
    reads = [s for s in spans if s[0] == "read"]
    packs = [s for s in spans if s[0] == "prepack"]
    arenas = sess.arenas.snapshot()
    res.update({
        "interp_ms": (t_main - a.spawn) * 1e3,
        "import_ms": (t_import - t_main) * 1e3,
        "plan_ms": (t_s1 - t_s0) * 1e3,
        "reads": len(reads),
        "read_mb": sess.state.reader.reader.bytes_read / C.MB,
        "read_total_ms": sum(e - s for _, s, e, _ in reads) * 1e3,
        "prepacks": len(packs),
        "prepack_total_ms": sum(e - s for _, s, e, _ in packs) * 1e3,
        "first_node_ms": (marks.get("first_node", t_out) - t_s0) * 1e3,
        "first_weight_node_ms": (marks.get("first_weight_node", t_out) - t_s0) * 1e3,
        "ttfo_ms": (t_out - t_s0) * 1e3,
        "ttfo_process_ms": (t_out - a.spawn) * 1e3,
        "ready_ms": (t_ready - t_s0) * 1e3,
        "prepare_wall_ms": (t_ready - t_prep0) * 1e3,
        "peak_rss_mb": C.max_rss_mb(),
        "max_inflight_mb": C.max_concurrent_bytes((s, e, n) for _, s, e, n in spans) / C.MB,
        "preparation_peak_mb": arenas["preparation"]["peak_live"] / C.MB,
        "prepared_mb": arenas["prepared"]["live"] / C.MB,
        "counters": dict(sess.counters),
        "logits_shape": list(out[0].shape),
    })
    if streaming:
        res.update(_trace_figures(recs, t_sub0, t_out, t_ready))
    sess.close()
    C.child_print(res)


def _child_cancel(a: argparse.Namespace, rs, feeds: dict) -> dict:
    from onnx_prepared.errors import Cancelled
    from onnx_prepared.model import ExternalDataReader

    def cancel_and_wait(h) -> float:
        t0 = time.perf_counter()
        h.cancel()
        with contextlib.suppress(Cancelled):
            h.wait()
        return (time.perf_counter() - t0) * 1e3

    # 1. cold: cancel right after submission
    sess = rs.RuntimeSession(a.model)
    h = sess.run_async(feeds)
    cold_ms = cancel_and_wait(h)
    cold_state = h.status.name.lower()
    cold_pc_yields = sess.counters["yields"]
    sess.close()

    # 2. gated: the run waits on its first-needed weight, whose read blocks until released (after GATE_S
    #    at the latest). Once alone (only the run wants the producer), once with prepare_async() sharing it.
    class GatedReader(ExternalDataReader):
        def __init__(self, names):
            super().__init__()
            self.names = set(names)
            self.gate = threading.Event()
            self.started = threading.Event()

        def read(self, desc):
            if desc.name in self.names:
                self.started.set()
                self.gate.wait(GATE_S)
            return super().read(desc)

    probe = rs.RuntimeSession(a.model)
    plan = probe.plan
    manifest = probe.resolved.manifest.active
    order = sorted(range(len(plan.requirements)), key=lambda i: plan.first_need[i])
    first = next(i for i in order if any(manifest[s].descriptor.is_external for s in plan.requirements[i].sources))
    names = plan.requirements[first].sources
    probe.close()
    out = {"mode": "cancel", "cold_cancel_ms": cold_ms, "cold_state": cold_state, "cold_yields": cold_pc_yields,
           "gated_weight": names[0], "gate_s": GATE_S}
    for variant in ("alone", "shared"):
        reader = GatedReader(names)
        sess = rs.RuntimeSession(a.model, reader=reader)
        h = sess.run_async(feeds)
        prep = sess.prepare_async() if variant == "shared" else None
        deadline = time.perf_counter() + 30
        while (sess.counters["yields"] < 1 or not reader.started.is_set()) and time.perf_counter() < deadline:
            time.sleep(0.0005)
        waiting = sess.counters["yields"] >= 1 and reader.started.is_set()
        time.sleep(0.01)  # the continuation has returned to the scheduler
        ms = cancel_and_wait(h)
        out[f"gated_{variant}_cancel_ms"] = ms
        out[f"gated_{variant}_state"] = h.status.name.lower()
        out[f"gated_{variant}_waiting"] = waiting
        out[f"gated_{variant}_waited_for_read"] = ms >= 0.9 * GATE_S * 1e3
        reader.gate.set()
        if prep is not None:
            prep.wait()
        sess.close()
    return out


# **** parent ****


_NUMERIC_SKIP = {"mode", "counters", "logits_shape", "overlap_ready", "overlap_ttfo"}


def _aggregate(runs: list[dict]) -> dict:
    """Median of every numeric field over repetitions (overlap dicts: median per fraction)."""
    out: dict = {"n": len(runs)}
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _NUMERIC_SKIP:
            out[k] = C.median([r[k] for r in runs])
        elif isinstance(v, dict) and k.startswith("overlap_"):
            out[k] = {kk: C.median([r[k][kk] for r in runs]) for kk in v}
        elif k not in _NUMERIC_SKIP:
            out[k] = v
    return out


def bench(a: argparse.Namespace) -> dict:
    env: dict[str, str] = {}
    me = os.path.abspath(__file__)
    results: dict = {"benchmark": "loading", "machine": C.machine(), "tokens": a.tokens, "reps": a.reps,
                     "presets": {}}
    for preset in a.presets:
        path = C.tiny_llm_path(a.models_dir, preset)
        files = C.model_files(path)
        raw: dict[str, list[dict]] = {}
        resident: dict[str, list[float]] = {"cold": [], "warm": []}
        for rep in range(a.reps):
            for cache in a.caches:
                for mode in C.rotate(list(a.modes), rep):
                    frac = C.set_cache(files, cache)
                    if frac is not None:
                        resident[cache].append(frac)
                    r = C.run_child([me, "--child", mode, "--model", path, "--tokens", str(a.tokens)], env)
                    raw.setdefault(f"{cache}/{mode}", []).append(r)
        cancels = []
        if a.cancel:
            for _ in range(a.reps):
                C.set_cache(files, "cold")
                cancels.append(C.run_child([me, "--child", "cancel", "--model", path, "--tokens", str(a.tokens)],
                                           env))
        agg = {k: _aggregate(v) for k, v in raw.items()}
        size_mb = sum(os.path.getsize(f) for f in files) / C.MB
        entry = {"model": path, "size_mb": round(size_mb, 1), "runs": agg,
                 "resident_before": {k: [round(x, 4) for x in v] for k, v in resident.items()}}
        if cancels:
            entry["cancel"] = {
                "cold_cancel_ms": C.median([c["cold_cancel_ms"] for c in cancels]),
                "cold_cancel_max_ms": max(c["cold_cancel_ms"] for c in cancels),
                "cold_states": sorted({c["cold_state"] for c in cancels}),
                "gated_weight": cancels[0]["gated_weight"], "gate_s": GATE_S,
            }
            for v in ("alone", "shared"):
                entry["cancel"][v] = {
                    "cancel_ms": C.median([c[f"gated_{v}_cancel_ms"] for c in cancels]),
                    "cancel_max_ms": max(c[f"gated_{v}_cancel_ms"] for c in cancels),
                    "states": sorted({c[f"gated_{v}_state"] for c in cancels}),
                    "waiting": all(c[f"gated_{v}_waiting"] for c in cancels),
                    "waited_for_read": any(c[f"gated_{v}_waited_for_read"] for c in cancels),
                }
        for cache in a.caches:
            s, p = agg.get(f"{cache}/sequential"), agg.get(f"{cache}/prepare")
            if s and p:
                entry.setdefault("sequential_vs_parallel", {})[cache] = {
                    "sequential_ms": s["prepare_wall_ms"], "parallel_ms": p["prepare_wall_ms"],
                    "speedup": s["prepare_wall_ms"] / p["prepare_wall_ms"],
                }
        if "cold/sequential" in agg and "warm/sequential" in agg:
            c, w = agg["cold/sequential"], agg["warm/sequential"]
            entry["cold_read_slowdown"] = c["read_total_ms"] / w["read_total_ms"] if w["read_total_ms"] else None
        results["presets"][preset] = entry
    return results


def print_table(res: dict) -> None:
    m = res["machine"]
    print(f"loading: prefill of {res['tokens']} tokens, medians of {res['reps']} fresh processes per row "
          f"(interleaved); cpus={m['cpu_count']} load={m['load_avg']}")
    for preset, e in res["presets"].items():
        print(f"\n== {preset}: {e['model']} ({e['size_mb']} MB)")
        cold = e["resident_before"].get("cold") or []
        if cold:
            print(f"page cache resident before cold runs: max {max(cold):.1%}"
                  + (f"; cold reads {e['cold_read_slowdown']:.1f}x slower than warm (sequential path)"
                     if e.get("cold_read_slowdown") else ""))
            if max(cold) > 0.05:
                print("WARNING: eviction did not work: cold figures are (partly) warm")
        rows = [{"run": k, **v} for k, v in e["runs"].items()]
        print(C.table(rows, [
            ("cache/mode", "run", ""), ("import ms", "import_ms", ".0f"), ("plan ms", "plan_ms", ".0f"),
            ("reads", "reads", ".0f"), ("read MB", "read_mb", ".1f"), ("read sum ms", "read_total_ms", ".0f"),
            ("prepacks", "prepacks", ".0f"), ("prepack sum ms", "prepack_total_ms", ".0f"),
            ("1st node ms", "first_node_ms", ".1f"), ("1st weight node ms", "first_weight_node_ms", ".1f"),
            ("TTFO ms", "ttfo_ms", ".0f"), ("TTFO proc ms", "ttfo_process_ms", ".0f"),
            ("ready ms", "ready_ms", ".0f"), ("prepare wall ms", "prepare_wall_ms", ".0f"),
            ("peak RSS MB", "peak_rss_mb", ".0f"), ("max in flight MB", "max_inflight_mb", ".1f"),
            ("prep arena peak MB", "preparation_peak_mb", ".1f"),
        ]))
        print("(times from RuntimeSession construction start; 'TTFO proc' from process start; 'prepare wall': "
              "stream = run_async -> all resident)")
        svp = e.get("sequential_vs_parallel")
        if svp:
            print("sequential vs parallel (same session tasks), wall time to fully prepared:")
            print(C.table([{"cache": k, **v} for k, v in svp.items()], [
                ("cache", "cache", ""), ("sequential ms", "sequential_ms", ".0f"),
                ("parallel ms", "parallel_ms", ".0f"), ("speedup", "speedup", ".2f"),
            ]))
        arows = [{"cache": k, **v} for k, v in e["runs"].items() if "/stream" in k]
        if arows:
            print("asynchronous execution (run_async with nothing prepared, traced; stream_prefetch: prepare_async() "
                  "submitted right after it):")
            print(C.table(arows, _async_cols(arows)))
            print("overlap as fractions of wall time (run_async -> all resident | run_async -> first output):")
            orows = []
            for r in arows:
                for label in ("ready", "ttfo"):
                    o = r[f"overlap_{label}"]
                    orows.append({"window": f"{r['cache']} {label}", **o})
            print(C.table(orows, [
                ("window", "window", ""), ("wall ms", "wall_ms", ".0f"), ("io", "io", ".2f"),
                ("prepack", "prepack", ".2f"), ("inference", "inference", ".2f"), ("io&inf", "io&inference", ".2f"),
                ("prepack&inf", "prepack&inference", ".2f"), ("io&prepack", "io&prepack", ".2f"),
                ("any busy", "any", ".2f"),
            ]))
        c = e.get("cancel")
        if c:
            print(f"cancellation latency (cancel() -> handle terminal), cold, right after submission: median "
                  f"{c['cold_cancel_ms']:.2f} ms (max {c['cold_cancel_max_ms']:.2f}, states {c['cold_states']})")
            for v, label in (("alone", "only the run wants it"), ("shared", "prepare_async() shares it")):
                g = c[v]
                note = (f"  <- waited for the in-flight read (released after {c['gate_s']:.0f} s)"
                        if g["waited_for_read"] else "")
                print(f"  run waiting on gated read of {c['gated_weight']} ({label}): median {g['cancel_ms']:.2f} ms "
                      f"(max {g['cancel_max_ms']:.2f}, states {g['states']}, was waiting: {g['waiting']}){note}")


def _async_cols(rows: list[dict]) -> list[tuple[str, str, str]]:
    for r in rows:
        for q in ("io", "prepack", "run"):
            r[f"_q{q}"] = f"{r[f'queue_{q}_median_ms']:.1f}/{r[f'queue_{q}_p95_ms']:.1f}"
    return [
        ("cache", "cache", ""), ("submit ms", "submit_ms", ".3f"), ("yields", "yields", ".0f"),
        ("wait total ms", "wait_total_ms", ".0f"), ("wait max ms", "wait_max_ms", ".1f"),
        ("run busy ms", "run_busy_ms", ".0f"), ("TTFO ms", "e2e_ms", ".0f"), ("all ready ms", "prepare_wall_ms", ".0f"),
        ("queue io med/p95 ms", "_qio", ""), ("queue prepack", "_qprepack", ""), ("queue run", "_qrun", ""),
        ("sched in flight MB", "sched_inflight_mb", ".1f"),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--presets", type=C.parse_list, default=["tiny", "medium"],
                    help="comma-separated tiny-llm presets (default tiny,medium; large is optional, ~1 GB)")
    ap.add_argument("--caches", type=C.parse_list, default=["cold", "warm"])
    ap.add_argument("--modes", type=C.parse_list, default=list(MODES))
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per row (median reported)")
    ap.add_argument("--tokens", type=int, default=16, help="prefill prompt length")
    ap.add_argument("--no-cancel", dest="cancel", action="store_false", help="skip the cancellation runs")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--child", choices=[*MODES, "cancel"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--spawn", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return 0
    bad = [c for c in a.caches if c not in ("cold", "warm")] + [m for m in a.modes if m not in MODES]
    if bad or a.reps < 1 or a.tokens < 1:
        ap.error(f"bad caches/modes {bad} or non-positive reps/tokens")
    C.emit(bench(a), a.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
