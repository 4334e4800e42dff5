"""The model corpus (tests/helpers/corpus.py) run by onnx_prepared and onnxruntime side by side.

Per model, in one process:

- ``match``: max abs / rel error of our outputs against onnxruntime's on the same feeds (and whether
  they pass the test suite's atol 1e-4 + rtol 1e-3, integers exact);
- ``create``: session construction, medians of ``--create-reps`` interleaved constructions (ours is
  metadata-only; onnxruntime's includes graph optimisation and prepacking), and ``first``: construction
  plus the first run, the time until an application has its first output;
- ``steady``: per-run time after warm-up (ours fully prepared), medians of ``--reps`` interleaved
  batches, each batch ~``--batch-ms`` long; the order of the two runtimes rotates per batch;
- ``fallback ops``: the ops of one steady run that went through the ``onnx.reference`` fallback (with
  their call counts, subgraph nodes included).

Both runtimes use their defaults (every core). Goals: steady <= 1.5x on each CNN and RNN, create <= 1.0x.

    python -m benchmarks.models [--models resnet18,lstm] [--reps 9] [--batch-ms 200] [--json]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

if __package__:  # python -m benchmarks.models
    from benchmarks import _common as C
else:  # python benchmarks/models.py
    import _common as C

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.helpers


def _fallback_counter() -> collections.Counter:
    try:
        from onnx_prepared.bind.reference import FALLBACK_CALLS
    except ImportError:
        from onnx_prepared.kernels.fallback import FALLBACK_CALLS
    return FALLBACK_CALLS


def _build(folder: str, name: str):
    """The corpus model ``name`` (exported into ``folder`` once, then reused)."""
    import pickle

    from tests.helpers.corpus import MODELS

    os.makedirs(folder, exist_ok=True)
    meta = os.path.join(folder, f"{name}.pkl")
    if os.path.exists(meta):
        with open(meta, "rb") as f:
            return pickle.load(f)
    print(f"[bench] exporting {name} into {folder} (once)", file=sys.stderr)
    cm = MODELS[name](folder)
    with open(meta + ".tmp", "wb") as f:
        pickle.dump(cm, f)
    os.replace(meta + ".tmp", meta)
    return cm


def _batch(fn, batch_ms: float) -> int:
    """Runs per batch so that one batch lasts about ``batch_ms`` (at least 1)."""
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    return max(1, int(batch_ms / 1e3 / max(dt, 1e-6)))


def bench_model(cm, a: argparse.Namespace) -> dict:
    import numpy as np
    import onnxruntime as ort

    import onnx_prepared
    from tests.helpers.corpus import max_errors, reference_path

    feeds = cm.feeds[0]
    so = ort.SessionOptions()
    so.log_severity_level = 3

    def make_ort():
        return ort.InferenceSession(cm.path, so, providers=["CPUExecutionProvider"])

    def make_ours():
        return onnx_prepared.InferenceSession(cm.path)

    # creation and first output, interleaved, after one untimed round (the process's one-time imports)
    for make in (make_ours, make_ort):
        make().run(None, feeds)
    create = {"ours": [], "ort": []}
    first = {"ours": [], "ort": []}
    for i in range(a.create_reps):
        for who, make in C.rotate([("ours", make_ours), ("ort", make_ort)], i):
            t0 = time.perf_counter()
            s = make()
            t1 = time.perf_counter()
            s.run(None, feeds)
            t2 = time.perf_counter()
            create[who].append(t1 - t0)
            first[who].append(t2 - t0)
            if who == "ours":
                s.close()
            del s

    ours, ref = make_ours(), make_ort()
    ours.prepare()
    # values from onnxruntime on the exact-integer twin where its u8s8 GEMM saturates (tests.helpers.ort_int8)
    checker = ort.InferenceSession(reference_path(cm.path), so, providers=["CPUExecutionProvider"])
    expected = checker.run(None, feeds)
    got = ours.run(None, feeds)
    abs_e, rel_e = max_errors(got, expected)
    ok = True
    for o, r in zip(got, expected):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape or o.dtype != r.dtype:
            ok = False
        elif r.dtype.kind in "fc":
            ok = ok and bool(np.allclose(o, r, atol=1e-4, rtol=1e-3))
        else:
            ok = ok and bool(np.array_equal(o, r))

    counter = _fallback_counter()
    before = dict(counter)
    ours.run(None, feeds)
    fallback = {k.split("::", 1)[-1]: v - before.get(k, 0) for k, v in counter.items() if v != before.get(k, 0)}

    def run_ours():
        ours.run(None, feeds)

    def run_ort():
        ref.run(None, feeds)

    for _ in range(2):
        run_ours()
        run_ort()
    n = {"ours": _batch(run_ours, a.batch_ms), "ort": _batch(run_ort, a.batch_ms)}
    steady = {"ours": [], "ort": []}
    for i in range(a.reps):
        for who, fn in C.rotate([("ours", run_ours), ("ort", run_ort)], i):
            t = time.perf_counter()
            for _ in range(n[who]):
                fn()
            steady[who].append((time.perf_counter() - t) / n[who])
    ours.close()
    med = {k: {w: C.median(v[w]) for w in ("ours", "ort")} for k, v in
           (("create", create), ("first", first), ("steady", steady))}
    return {
        "model": cm.name, "kind": cm.kind, "covers": cm.covers, "match": ok, "max_abs": abs_e, "max_rel": rel_e,
        "create_ms_ours": med["create"]["ours"] * 1e3, "create_ms_ort": med["create"]["ort"] * 1e3,
        "create_ratio": med["create"]["ours"] / med["create"]["ort"],
        "first_ms_ours": med["first"]["ours"] * 1e3, "first_ms_ort": med["first"]["ort"] * 1e3,
        "first_ratio": med["first"]["ours"] / med["first"]["ort"],
        "steady_ms_ours": med["steady"]["ours"] * 1e3, "steady_ms_ort": med["steady"]["ort"] * 1e3,
        "steady_ratio": med["steady"]["ours"] / med["steady"]["ort"],
        "fallback_ops": fallback, "reps": a.reps, "create_reps": a.create_reps,
    }


def bench(a: argparse.Namespace) -> dict:
    from tests.helpers.corpus import MODELS

    names = C.parse_list(a.models) if a.models else list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; corpus: {list(MODELS)}")
    folder = os.path.join(a.models_dir, "corpus")
    rows = []
    for name in names:
        cm = _build(folder, name)
        rows.append(bench_model(cm, a))
        if not a.json:
            print(f"[bench] {name}: steady {rows[-1]['steady_ratio']:.2f}x, create {rows[-1]['create_ratio']:.2f}x",
                  file=sys.stderr)
    return {"benchmark": "models", "machine": C.machine(), "rows": rows}


def print_table(res: dict) -> None:
    rows = [dict(r, err=f"{r['max_abs']:.1e}/{r['max_rel']:.1e}",
                 fb=", ".join(f"{k}x{v}" for k, v in sorted(r["fallback_ops"].items())) or "-") for r in res["rows"]]
    print(f"corpus models, ours vs onnxruntime (medians: {res['rows'][0]['reps']} interleaved steady batches, "
          f"{res['rows'][0]['create_reps']} creations; load avg {res['machine']['load_avg']})")
    print(C.table(rows, [
        ("model", "model", ""), ("kind", "kind", ""), ("match", "match", ""), ("max abs/rel err", "err", ""),
        ("steady ms", "steady_ms_ours", ".2f"), ("ort ms", "steady_ms_ort", ".2f"), ("steady x", "steady_ratio", ".2f"),
        ("create ms", "create_ms_ours", ".1f"), ("ort ms", "create_ms_ort", ".1f"), ("create x", "create_ratio", ".2f"),
        ("first x", "first_ratio", ".2f"), ("fallback ops (calls per run)", "fb", ""),
    ]))
    print("goals: steady <= 1.5x on each CNN and RNN, create <= 1.0x")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="", help="comma-separated corpus names (default: all)")
    p.add_argument("--reps", type=int, default=9, help="interleaved steady-state batches per runtime")
    p.add_argument("--create-reps", type=int, default=5, help="interleaved session constructions per runtime")
    p.add_argument("--batch-ms", type=float, default=200.0, help="length of one steady-state batch")
    p.add_argument("--models-dir", default=C.MODELS_DIR)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    C.emit(bench(a), a.json, print_table)


if __name__ == "__main__":
    main()
