"""Prepared cache: time to first output and to fully prepared, without / with a complete / with an incomplete cache.

Each measurement is a fresh process, started right after the model's and the companions' files were
evicted from the page cache (``cold``, ``posix_fadvise(DONTNEED)``, checked with ``mincore``) or read
once (``warm``). Configurations, interleaved in rotating order within each repetition, on a prefill of
``--tokens`` tokens:

- ``none``: ``prepared_model_policy="disabled"`` (read sources, prepack)
- ``complete``: ``read_only`` on a companion built beforehand (``onnx-prepared cache build``, i.e.
  ``build_if_missing`` + ``prepare()``; checked with ``cache verify``)
- ``missing1``: ``read_only`` on a copy of that companion with one entry removed (``--drop``: the
  largest entry, or the first one the plan needs): the data files are hard-linked and the companion index is
  the complete one without that ``prepared/...`` initializer, written to a temporary file and renamed
- ``missing1-build``: ``build_if_missing`` on a fresh such copy per process (the miss is rebuilt,
  persisted and flushed before ``prepare()`` returns)
- ``ort``: onnxruntime, measured by ``ttfo.py``'s child (import, session creation, first run)

Per process: TTFO (session construction start -> first logits; also from process start, and
import + session + first run as for onnxruntime), time until fully prepared (``prepare()`` returning,
from session construction start), bytes read from the source ``.data`` and from the companion's
payloads (at first output and in total), bytes the process fetched from storage (``/proc/self/io``),
task counts, a phase split of the first run (plan construction, run compute / wait from the scheduler
trace, summed read_packed / pread / checksum / decode, source-read and prepack durations), process
CPU time, and the hot forward time of the same prefill once everything is resident (the kernels are
the same as the first run's).

Goal reference (issue): TTFO with a complete cache <= 1.3x (cold read of the needed packed bytes, one
``preadv`` per entry in file order, measured here in the same cache state + the hot forward pass); and
cold TTFO (import + session + first run) <= 0.4x onnxruntime's on the medium preset.

    python benchmarks/cache.py [--presets tiny,medium[,large]] [--reps 5] [--tokens 16] [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import Counter

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
else:  # python benchmarks/NAME.py
    import _common as C

CONFIGS = ("none", "complete", "missing1", "missing1-build", "ort")
POLICY = {"none": "disabled", "complete": "read_only", "missing1": "read_only", "missing1-build": "build_if_missing"}
GOAL_READ_FORWARD = 1.3
GOAL_VS_ORT = {"medium": 0.4}
STEM = "tiny-llm.prepared.onnx"
_MINS = ("ttfo_ms", "ttfo_import_ms", "ready_ms", "hot_ms")
_KINDS = ("read_packed", "payload", "pread", "source_read", "prepack")


# **** child process ****


def _proc_io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (ln.split(": ") for ln in f.read().splitlines() if ln)}
    except OSError:
        return {}


def _timed(obj, attr: str, kind: str, spans: list) -> None:
    """Replace ``obj.attr`` with a wrapper appending ``(kind, start, end)`` to ``spans``."""
    fn = getattr(obj, attr)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spans.append((kind, t0, time.perf_counter()))

    setattr(obj, attr, wrapper)


def _span_sums(spans: list, lo: float, hi: float) -> dict[str, float]:
    """Summed duration (ms) of each kind's spans, clipped to ``[lo, hi]``."""
    out = dict.fromkeys(_KINDS, 0.0)
    for kind, s, e in spans:
        out[kind] += max(0.0, min(e, hi) - max(s, lo)) * 1e3
    return out


def child(a: argparse.Namespace) -> None:
    t_main = time.perf_counter()
    import numpy as np

    t_np = time.perf_counter()
    import onnx_prepared.runtime.session as rs
    from onnx_prepared.prepared import cache_io

    t_imp = time.perf_counter()
    feeds = C.llm_prefill_feeds(a.model, a.tokens)
    t_feeds = time.perf_counter()
    spans: list = []
    _timed(cache_io, "_preadv_all", "pread", spans)  # the preadv calls of payload reads (module-level function)
    _timed(cache_io, "map_payload", "pread", spans)  # or a hit's populated mapping of its payload (the read)
    opts = {"trace": True, "prepared_model_policy": POLICY[a.child]}
    if a.companion:
        opts["prepared_model_path"] = a.companion
    io0 = _proc_io()
    c_s0 = time.process_time()
    t_s0 = time.perf_counter()
    sess = rs.RuntimeSession(a.model, opts)
    t_s1 = time.perf_counter()
    st, ps = sess.state, sess.companion
    _timed(st, "read_packed", "read_packed", spans)
    _timed(st, "prepack", "prepack", spans)
    _timed(st.reader, "read", "source_read", spans)
    if ps is not None:
        _timed(ps, "read_payload", "payload", spans)

    def nbytes() -> tuple[float, float]:
        return st.reader.reader.bytes_read / C.MB, (ps.bytes_read if ps is not None else 0) / C.MB

    handle = sess.run_async(feeds)
    eager = sess.prepare_async() if a.eager else None  # every producer submitted now, in need order
    out = handle.result()
    t_out = time.perf_counter()
    c_out = time.process_time()
    src_out, comp_out = nbytes()
    sess.prepare()
    t_ready = time.perf_counter()
    c_ready = time.process_time()
    del eager
    src, comp = nbytes()
    io1 = _proc_io()
    hot, hot_cpu = [], []
    for _ in range(a.hot):
        c0, t0 = time.process_time(), time.perf_counter()
        sess.run(feeds)
        hot.append((time.perf_counter() - t0) * 1e3)
        hot_cpu.append((time.process_time() - c0) * 1e3)
    hot_runs = sess.counters["hot_runs"]
    recs = sess.scheduler.trace.records()
    kinds: Counter[str] = Counter()
    for k, n in st.counters.items():
        kinds[k.split(":", 1)[0]] += n
    rereads = sum(1 for k, n in st.counters.items() if k.startswith("read:") and n > 1)
    sess.close()
    busy = sum(min(r.finished, t_out) - r.started for r in recs if r.name.startswith("I.run") and r.started < t_out)
    before = _span_sums(spans, t_s0, t_out)
    total = _span_sums(spans, t_s0, t_ready)
    logits = np.asarray(out[0])[0, -1]
    res = {
        "config": a.child, "interp_ms": (t_main - a.spawn) * 1e3, "numpy_ms": (t_np - t_main) * 1e3,
        "import_ms": (t_imp - t_np) * 1e3, "feeds_ms": (t_feeds - t_imp) * 1e3, "session_ms": (t_s1 - t_s0) * 1e3,
        "run_ms": (t_out - t_s1) * 1e3, "ttfo_ms": (t_out - t_s0) * 1e3, "ttfo_process_ms": (t_out - a.spawn) * 1e3,
        "ttfo_import_ms": (t_imp - t_main + t_out - t_s0) * 1e3, "ready_ms": (t_ready - t_s0) * 1e3,
        "cpu_out_ms": (c_out - c_s0) * 1e3, "cpu_ready_ms": (c_ready - c_s0) * 1e3,
        "hot_ms": C.median(hot), "hot_cpu_ms": C.median(hot_cpu),
        "hot_runs": hot_runs,
        "src_mb_out": src_out, "comp_mb_out": comp_out, "src_mb": src, "comp_mb": comp,
        "disk_mb": (io1.get("read_bytes", 0) - io0.get("read_bytes", 0)) / C.MB if io0 else None,
        "written_mb": (io1.get("write_bytes", 0) - io0.get("write_bytes", 0)) / C.MB if io0 else None,
        "reads": kinds["read"], "prepacks": kinds["prepack"], "read_packed": kinds["read_packed"],
        "persists": kinds["persist"], "corrupt": kinds["cache_corrupt"], "reread_sources": rereads,
        "run_compute_ms": busy * 1e3, "run_wait_ms": (t_out - t_s1 - busy) * 1e3,
        "peak_rss_mb": C.max_rss_mb(), "argmax": int(logits.argmax()),
    }
    for k in _KINDS:
        res[f"{k}_sum_ms"], res[f"{k}_total_ms"] = before[k], total[k]
    # checksum (XXH3-128, hashed per chunk between preadvs, or whole once mapped) = read_payload minus its reads;
    # decode+publish = read_packed minus read_payload
    for suffix in ("sum_ms", "total_ms"):
        res[f"checksum_{suffix}"] = res[f"payload_{suffix}"] - res[f"pread_{suffix}"]
        res[f"decode_{suffix}"] = res[f"read_packed_{suffix}"] - res[f"payload_{suffix}"]
    C.child_print(res)


# **** companions (built once per run of this script, in <models-dir>/companions/<preset>) ****


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnx_prepared.cli", *args], capture_output=True, text=True)


def _inspect(model: str, companion: str) -> dict:
    """Packed entries (plan need order) and raw source ranges a read_only session over ``companion`` uses."""
    from onnx_prepared.runtime.session import RuntimeSession

    with RuntimeSession(model, {"prepared_model_policy": "read_only", "prepared_model_path": companion}) as s:
        reqs = [s.plan.requirements[b] for b in s.need_order]
        packed = [r for r in reqs if not r.key.is_raw]
        raw = [e.descriptor.payload for e in s.resolved.manifest.active.values()
               if e.descriptor is not None and e.descriptor.is_external]
        return {
            "uncached": [str(r.key) for r in packed if not r.cached],
            "entries": [r.active.entry for r in packed if r.cached],
            "raw": [(p.file, p.offset, p.length) for p in raw],
        }


def copy_without(complete: str, folder: str, drop: str) -> str:
    """A copy of companion ``complete`` in ``folder`` without entry ``drop`` (data files hard-linked)."""
    import onnx

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    src = os.path.dirname(complete)
    for f in os.listdir(src):
        if f.endswith(".data"):
            try:
                os.link(os.path.join(src, f), os.path.join(folder, f))  # never written in place by a flush
            except OSError:
                shutil.copy2(os.path.join(src, f), os.path.join(folder, f))
    m = onnx.load_model(complete, load_external_data=False)
    keep = [t for t in m.graph.initializer if t.name != drop]
    if len(keep) != len(m.graph.initializer) - 1:
        raise RuntimeError(f"companion {complete} has no entry {drop!r}")
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    path = os.path.join(folder, os.path.basename(complete))
    with open(path + ".tmp", "wb") as f:
        f.write(m.SerializeToString())
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return path


def companions(a: argparse.Namespace, preset: str, model: str) -> dict:
    root = os.path.join(a.models_dir, "companions", preset)
    complete = os.path.join(root, "complete", STEM)
    t0 = time.perf_counter()
    p = _cli("cache", "build", model, "--out", complete, "--quiet")  # tops up a companion left by an earlier run
    if p.returncode != 0:
        raise RuntimeError(f"cache build failed:\n{p.stderr[-3000:]}")
    build_ms = (time.perf_counter() - t0) * 1e3
    v = _cli("cache", "verify", complete, "--model", model)
    if v.returncode != 0:
        raise RuntimeError(f"cache verify {complete} failed:\n{v.stdout[-3000:]}")
    info = _inspect(model, complete)
    if info["uncached"]:
        raise RuntimeError(f"companion {complete} misses {info['uncached'][:3]} after a build")
    entries = info["entries"]
    dropped = entries[0] if a.drop == "first" else max(entries, key=lambda e: e.length)
    missing = copy_without(complete, os.path.join(root, "missing1"), dropped.key_name)
    if len(_inspect(model, missing)["uncached"]) != 1:
        raise RuntimeError(f"companion {missing} should miss exactly {dropped.key_name!r}")
    return {
        "complete": complete, "missing1": missing, "runs": os.path.join(root, "runs"), "build_ms": build_ms,
        "entries": len(entries), "packed_mb": sum(e.length for e in entries) / C.MB,
        "packed_ranges": sorted((e.file, e.offset, e.length) for e in entries),
        "raw_ranges": sorted(info["raw"]), "raw_mb": sum(n for _, _, n in info["raw"]) / C.MB,
        "dropped": dropped.key_name, "dropped_mb": dropped.length / C.MB,
        "dropped_position": entries.index(dropped), "companion_onnx_kb": os.path.getsize(complete) / 1024,
    }


def _folder_files(*folders: str) -> list[str]:
    return [os.path.join(d, f) for d in folders if os.path.isdir(d) for f in sorted(os.listdir(d))
            if f.endswith((".onnx", ".data"))]


def raw_read_ms(ranges: list[tuple[str, int, int]]) -> float:
    """Read the byte ranges (file order) with ``preadv`` into fresh buffers, one per range, as the runtime does."""
    import numpy as np

    fds: dict[str, int] = {}
    t0 = time.perf_counter()
    try:
        for file, off, n in ranges:
            fd = fds.get(file)
            if fd is None:
                fd = fds[file] = os.open(file, os.O_RDONLY)
            mv, got = memoryview(np.empty(n, np.uint8)), 0
            while got < n and (k := os.preadv(fd, [mv[got:]], off + got)):
                got += k
        return (time.perf_counter() - t0) * 1e3
    finally:
        for fd in fds.values():
            os.close(fd)


# **** parent ****


def _ort_child(a: argparse.Namespace, model: str) -> dict:
    """onnxruntime's import + session + first run, timed by ttfo.py's child (same phases as ours)."""
    r = C.run_child([os.path.join(os.path.dirname(os.path.abspath(__file__)), "ttfo.py"), "--child", "ort",
                     "--model", model, "--tokens", str(a.tokens)])
    return {**r, "config": "ort", "ttfo_process_ms": r["ttfo_ms"], "ttfo_ms": r["session_ms"] + r["run_ms"],
            "ttfo_import_ms": r["numpy_ms"] + r["import_ms"] + r["session_ms"] + r["run_ms"]}


def bench(a: argparse.Namespace) -> dict:
    C.compile_package()  # children import compiled modules, as from an installed wheel
    me = os.path.abspath(__file__)
    res: dict = {"benchmark": "cache", "machine": C.machine(), "reps": a.reps, "tokens": a.tokens, "eager": a.eager,
                 "goals": {"read_forward": GOAL_READ_FORWARD, "vs_ort": GOAL_VS_ORT}, "presets": {}}
    models = {p: C.tiny_llm_path(a.models_dir, p) for p in a.presets}
    comps = {p: companions(a, p, models[p]) for p in a.presets}
    raw: dict[tuple, list[dict]] = {}
    reads: dict[tuple, list[tuple[float, float]]] = {}
    resident: list[float] = []
    for rep in range(a.reps):
        for preset in a.presets:
            model, c = models[preset], comps[preset]
            base = C.model_files(model) + _folder_files(os.path.dirname(c["complete"]), os.path.dirname(c["missing1"]))
            for cache in a.caches:
                C.set_cache(base, cache)  # the goal's reference: raw reads of the packed, then the raw source bytes
                reads.setdefault((preset, cache), []).append((raw_read_ms(c["packed_ranges"]),
                                                               raw_read_ms(c["raw_ranges"])))
                for cfg in C.rotate(list(a.configs), rep):
                    companion = {"complete": c["complete"], "missing1": c["missing1"]}.get(cfg)
                    files = base
                    if cfg == "missing1-build":
                        companion = copy_without(c["complete"], c["runs"], c["dropped"])
                        files = base + _folder_files(c["runs"])
                    frac = C.set_cache(files, cache)
                    if cache == "cold" and frac is not None:
                        resident.append(frac)
                    if cfg == "ort":
                        r = _ort_child(a, model)
                    else:
                        args = [me, "--child", cfg, "--model", model, "--tokens", str(a.tokens), "--hot", str(a.hot)]
                        args += ["--eager"] if a.eager else []
                        r = C.run_child(args + (["--companion", companion] if companion else []))
                    raw.setdefault((preset, cache, cfg), []).append(r)
                    if cfg == "missing1-build":
                        shutil.rmtree(c["runs"], ignore_errors=True)
    for preset in a.presets:
        c = comps[preset]
        e = res["presets"][preset] = {k: v for k, v in c.items() if not k.endswith("_ranges")}
        e["rows"], e["goals"] = [], []
        for cache in a.caches:
            rows = {}
            for cfg in a.configs:
                runs = raw[(preset, cache, cfg)]
                row = {"cache": cache, "config": cfg, "n": len(runs)}
                for k, v in runs[0].items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "argmax":
                        row[k] = C.median([r.get(k) for r in runs])
                for k in _MINS:  # the least disturbed process, on a loaded machine
                    if runs[0].get(k) is not None:
                        row[f"{k}_min"] = min(r[k] for r in runs)
                row["argmaxes"] = sorted({r["argmax"] for r in runs})
                rows[cfg] = row
                e["rows"].append(row)
            e["goals"].append(_goals(preset, cache, rows, reads[(preset, cache)]))
    res["resident_before_cold"] = [round(min(resident), 4), round(max(resident), 4)] if resident else None
    return res


def _goals(preset: str, cache: str, rows: dict, reads: list[tuple[float, float]]) -> dict:
    """Ratios of one (preset, cache): vs the read+forward reference, vs onnxruntime, vs no cache."""
    g: dict = {"cache": cache, "packed_read_ms": C.median([p for p, _ in reads]),
               "raw_source_read_ms": C.median([s for _, s in reads])}
    base, ort, comp = rows.get("none"), rows.get("ort"), rows.get("complete")
    argmax = {tuple(r["argmaxes"]) for r in rows.values()}
    g["same_argmax"] = len(argmax) == 1 and len(argmax.pop()) == 1
    for r in rows.values():
        if base is not None and r is not base and r["config"] != "ort":
            r["vs_none"] = r["ttfo_ms"] / base["ttfo_ms"]
            r["ready_vs_none"] = r["ready_ms"] / base["ready_ms"]
        if ort is not None and r is not ort:
            r["vs_ort"] = r["ttfo_import_ms"] / ort["ttfo_import_ms"]
            r["vs_ort_process"] = r["ttfo_process_ms"] / ort["ttfo_process_ms"]
    if comp is not None:
        g["forward_hot_ms"] = comp["hot_ms"]
        g["reference_ms"] = g["packed_read_ms"] + comp["hot_ms"]
        g["ttfo_ms"] = comp["ttfo_ms"]
        g["read_forward_ratio"] = comp["ttfo_ms"] / g["reference_ms"]
        g["read_forward_ratio_with_sources"] = comp["ttfo_ms"] / (g["reference_ms"] + g["raw_source_read_ms"])
        g["read_forward_ratio_min"] = comp["ttfo_ms_min"] / (min(p for p, _ in reads) + comp["hot_ms_min"])
        g["meets_read_forward"] = g["read_forward_ratio"] <= GOAL_READ_FORWARD
        if ort is not None:
            g["vs_ort"], g["vs_ort_process"] = comp["vs_ort"], comp["vs_ort_process"]
            g["vs_ort_min"] = comp["ttfo_import_ms_min"] / ort["ttfo_import_ms_min"]
            goal = GOAL_VS_ORT.get(preset)
            g["meets_vs_ort"] = comp["vs_ort"] <= goal if goal is not None and cache == "cold" else None
    return g


def print_table(res: dict) -> None:
    m = res["machine"]
    print(f"prepared cache: TTFO (session start -> logits of a {res['tokens']}-token prefill) and time until fully "
          f"prepared; medians of {res['reps']} fresh processes, interleaved; cpus={m['cpu_count']} "
          f"load={m['load_avg']}" + ("; --eager: prepare_async() right after run_async()" if res.get("eager") else ""))
    rb = res.get("resident_before_cold")
    if rb:
        print(f"page cache resident before cold runs: {rb[0]:.1%}..{rb[1]:.1%}"
              + ("  WARNING: eviction did not work" if rb[1] > 0.05 else ""))
    for preset, e in res["presets"].items():
        print(f"\n== {preset}: {e['entries']} packed entries, {e['packed_mb']:.1f} MB packed + {e['raw_mb']:.1f} MB "
              f"raw sources; companion index {e['companion_onnx_kb']:.0f} KB; missing1 drops {e['dropped']} "
              f"({e['dropped_mb']:.1f} MB, #{e['dropped_position']} in need order)")
        print(C.table(e["rows"], [
            ("cache", "cache", ""), ("config", "config", ""), ("import", "import_ms", ".0f"),
            ("plan", "session_ms", ".0f"), ("1st run", "run_ms", ".0f"), ("TTFO", "ttfo_ms", ".0f"),
            ("min", "ttfo_ms_min", ".0f"), ("TTFO proc", "ttfo_process_ms", ".0f"),
            ("imp+sess+run", "ttfo_import_ms", ".0f"),
            ("vs ort", "vs_ort", ".2f"), ("vs none", "vs_none", ".2f"), ("ready", "ready_ms", ".0f"),
            ("ready/none", "ready_vs_none", ".2f"), ("src MB@out", "src_mb_out", ".1f"),
            ("cmp MB@out", "comp_mb_out", ".1f"), ("src MB", "src_mb", ".1f"), ("cmp MB", "comp_mb", ".1f"),
            ("disk MB", "disk_mb", ".1f"), ("wr MB", "written_mb", ".1f"), ("reads", "reads", ".0f"),
            ("prepacks", "prepacks", ".0f"), ("rd_packed", "read_packed", ".0f"), ("persists", "persists", ".0f"),
            ("reread", "reread_sources", ".0f"), ("hot fwd", "hot_ms", ".0f"),
        ]))
        ours = [r for r in e["rows"] if r["config"] != "ort"]
        print("\nfirst run split (ms until first output; task sums over threads): compute/wait from the trace; "
              "checksum = read_payload - pread; decode = read_packed - read_payload; CPU = process CPU time")
        print(C.table(ours, [
            ("cache", "cache", ""), ("config", "config", ""), ("TTFO", "ttfo_ms", ".0f"), ("CPU", "cpu_out_ms", ".0f"),
            ("plan", "session_ms", ".0f"),
            ("run compute", "run_compute_ms", ".0f"), ("run wait", "run_wait_ms", ".0f"),
            ("read_packed", "read_packed_sum_ms", ".0f"), ("pread", "pread_sum_ms", ".0f"),
            ("checksum", "checksum_sum_ms", ".0f"), ("decode", "decode_sum_ms", ".0f"),
            ("src read", "source_read_sum_ms", ".0f"), ("prepack", "prepack_sum_ms", ".0f"),
            ("hot fwd", "hot_ms", ".0f"), ("hot CPU", "hot_cpu_ms", ".0f"),
            ("ready CPU", "cpu_ready_ms", ".0f"),
        ]))
        print(f"\ngoals: complete-cache TTFO <= {GOAL_READ_FORWARD}x (cold/warm preadv of the packed bytes + hot "
              f"forward); cold imp+sess+run <= {GOAL_VS_ORT.get(preset, '-')}x onnxruntime's")
        print(C.table(e["goals"], [
            ("cache", "cache", ""), ("packed read", "packed_read_ms", ".0f"), ("+raw src", "raw_source_read_ms", ".0f"),
            ("hot fwd", "forward_hot_ms", ".0f"), ("reference", "reference_ms", ".0f"), ("TTFO", "ttfo_ms", ".0f"),
            ("TTFO/ref", "read_forward_ratio", ".2f"), ("/ref+src", "read_forward_ratio_with_sources", ".2f"),
            ("mins", "read_forward_ratio_min", ".2f"), ("meets", "meets_read_forward", ""),
            ("vs ort", "vs_ort", ".2f"), ("mins", "vs_ort_min", ".2f"), ("proc vs ort", "vs_ort_process", ".2f"),
            ("meets", "meets_vs_ort", ""), ("same argmax", "same_argmax", ""),
        ]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--presets", type=C.parse_list, default=["tiny", "medium"],
                    help="comma-separated tiny-llm presets (default tiny,medium)")
    ap.add_argument("--configs", type=C.parse_list, default=list(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    ap.add_argument("--caches", type=C.parse_list, default=["cold", "warm"])
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per row (median reported)")
    ap.add_argument("--tokens", type=int, default=16, help="prefill length (default 16)")
    ap.add_argument("--hot", type=int, default=3, help="hot runs after prepare() per process (forward reference)")
    ap.add_argument("--drop", choices=["largest", "first"], default="largest",
                    help="entry missing1 lacks: the largest, or the first the plan needs")
    ap.add_argument("--eager", action="store_true",
                    help="call prepare_async() right after run_async(): every producer is submitted at once")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--child", choices=[c for c in CONFIGS if c != "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--companion", help=argparse.SUPPRESS)
    ap.add_argument("--spawn", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return 0
    bad = [c for c in a.caches if c not in ("cold", "warm")] + [c for c in a.configs if c not in CONFIGS]
    if bad or a.reps < 1 or a.tokens < 1 or a.hot < 1:
        ap.error(f"bad caches/configs {bad} or non-positive reps/tokens/hot")
    if "ort" in a.configs:
        import importlib.util

        if importlib.util.find_spec("onnxruntime") is None:
            ap.error("onnxruntime is not installed (pip install onnxruntime), or pass --configs without ort")
    C.emit(bench(a), a.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
