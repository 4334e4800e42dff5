"""Whole-model INT4 LLM, steady state: prefill and one KV-cache decode step, ours vs onnxruntime in one process.

Models (generated once into ``--models-dir``): ``medium`` (the medium preset: tied INT4 embedding through
GatherBlockQuantized, shared with the LM head) and ``medium-genai`` (the same dimensions in
onnxruntime-genai's builder default shape: an untied float32 embedding read by Gather and a separate INT4
MatMulNBits LM head), each at MatMulNBits ``accuracy_level`` 0 (onnxruntime computes in fp32) and 4 (the
generator's default; onnxruntime quantizes activations to int8). ``tiny`` (the spec's model) is available too.

Phases, on the same feeds for every side: ``prefill16`` / ``prefill128`` (batch 1, that many tokens, empty KV
cache) and ``decode`` (one token after a past of the longest prompt; the past is onnxruntime's prefill
presents). Sides, interleaved in rounds (each side's thread pools spin down on its own time):

- ``ours``: :class:`~onnx_prepared.runtime.RuntimeSession` after ``prepare()`` (hot path), default options
  (``intra_op_num_threads=0``: every core);
- ``ours-1t``: the same with ``intra_op_num_threads=1``;
- ``ort``: onnxruntime, default options (its intra-op pool: one thread per core);
- ``ort-1t``: onnxruntime with ``intra_op_num_threads=1``.

Times are medians; ``x ort`` = ours / ort (and ``x ort 1t`` = ours-1t / ort-1t). The load average is read
before and after every (model, level) block: the machine may be shared. Goals (issue 10), at level 4:
decode step <= 1.0x onnxruntime, prefill of 128 tokens <= 0.6x. ``--profile`` adds our time per op (hot
path kernels wrapped with a timer), per op type and per node shape, and what is left outside the kernels.

    python benchmarks/llm.py [--models medium,medium-genai] [--levels 0,4] [--prompts 16,128] [--repeat 20]
                             [--sides ours,ours-1t,ort,ort-1t] [--profile] [--json] [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections import defaultdict

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
else:  # python benchmarks/NAME.py
    import _common as C

GOALS = {"decode": 1.0, "prefill128": 0.6}  # level 4, ours / onnxruntime
MODELS = {"tiny": {}, "medium": {"preset": "medium"}, "medium-genai": {"preset": "medium", "embedding": "fp32"}}
SIDES = ("ours", "ours-1t", "ort", "ort-1t")


# **** models and feeds ****


def model_path(models_dir: str, model: str, level: int) -> str:
    """The cached model: ``<model>`` at level 4 (``medium`` is the folder other benchmarks share), else
    ``<model>-acc<level>``."""
    if level == 4 and model in ("tiny", "medium"):
        return C.tiny_llm_path(models_dir, model)
    from onnx_prepared.generate import MODEL_FILE, generate_tiny_llm

    out = os.path.join(models_dir, model if level == 4 else f"{model}-acc{level}")
    path = os.path.join(out, MODEL_FILE)
    if not os.path.exists(path):
        print(f"[bench] generating {model!r} accuracy_level {level} into {out} (once)", file=sys.stderr)
        generate_tiny_llm(out, accuracy_level=level, **MODELS[model])
    return path


# **** timing ****


#: seconds each batch waits before it starts, so that the previous side's spinning threads are idle
SETTLE_S = 0.05


def interleaved(fns: dict, repeat: int, rounds: int = 5, settle: float = SETTLE_S) -> dict[str, float]:
    """Median seconds per function; functions alternate in rounds of ``repeat // rounds`` calls, each round
    after a pause of ``settle`` seconds and one untimed call.

    NOTE: onnxruntime's intra-op threads spin for 10-30 ms after a run (see benchmarks/kernels_nbits.py),
    longer than a batch of short runs, so without the pause our batch after onnxruntime's ran with the
    second core taken by onnxruntime's spinning thread (medium, level 4, prefill 16, quiet machine: ours
    13.0 ms without the pause, 10.2 ms with it; onnxruntime 17.0 and 17.0 ms).
    """
    times: dict[str, list[float]] = {k: [] for k in fns}
    per = max(1, repeat // rounds)
    for _ in range(rounds):
        for k, fn in fns.items():
            time.sleep(settle)
            fn()
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


# **** profile ****


@contextlib.contextmanager
def timed_kernels(plan, acc: dict[str, float]):
    """Wrap every hot-path kernel call of ``plan`` (an ExecutionPlan) with a timer summing into ``acc``.

    NOTE: patches the plan's derived ``steps`` (what ``replay`` iterates) and restores them on exit.
    """
    orig = plan.steps

    def wrap(step):
        call, *rest = step
        key = _op_label(rest[-1].kernel.name)

        def timed(*args):
            t0 = time.perf_counter()
            try:
                return call(*args)
            finally:
                acc[key] += time.perf_counter() - t0

        return (timed, *rest)

    object.__setattr__(plan, "steps", tuple(wrap(s) for s in orig))
    try:
        yield
    finally:
        object.__setattr__(plan, "steps", orig)


def _op_label(kernel_name: str) -> str:
    if kernel_name.startswith("prepacked:matmul-nbits"):
        k, n = kernel_name.rsplit("-", 2)[-2:]
        return f"MatMulNBits {k}x{n}"
    return kernel_name.split("::")[-1].rsplit("-", 1)[0]


def profile(sess, feeds: dict, reps: int) -> dict:
    """Ours: mean ms per run, per op label and per op type, plus ``outside kernels``."""
    acc: dict[str, float] = defaultdict(float)
    if not hasattr(sess.plan.execution, "steps"):
        return {"error": "ExecutionPlan has no derived steps to wrap"}
    with timed_kernels(sess.plan.execution, acc):
        sess.run(feeds)
        acc.clear()
        t0 = time.perf_counter()
        for _ in range(reps):
            sess.run(feeds)
        total = time.perf_counter() - t0
    ops = {k: v / reps * 1e3 for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}
    by_type: dict[str, float] = defaultdict(float)
    for k, ms in ops.items():
        by_type[k.split(" ")[0]] += ms
    return {"run_ms": total / reps * 1e3, "ops_ms": ops,
            "op_types_ms": dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
            "outside_kernels_ms": (total - sum(acc.values())) / reps * 1e3}


# **** one model ****


def _native_info() -> dict:
    try:
        from onnx_prepared.kernels import _native
    except ImportError:
        return {"native": None}
    info = getattr(_native, "info", None)
    return {"native": info() if callable(info) else str(getattr(_native, "LEVEL", "present"))}


def bench_model(path: str, prompts: list[int], repeat: int, sides: list[str], want_profile: bool) -> dict:
    import numpy as np
    import onnxruntime as ort

    from onnx_prepared.generate import TinyLlmConfig, decode_feeds, prefill_feeds
    from onnx_prepared.runtime import RuntimeSession

    config = TinyLlmConfig.from_model(path)
    load_before = C.machine()["load_avg"]
    runs: dict = {}
    closers = []
    for side in sides:
        one = side.endswith("-1t")
        if side.startswith("ours"):
            s = RuntimeSession(path, {"intra_op_num_threads": 1} if one else None)
            s.prepare()
            runs[side] = s.run
            closers.append(s.close)
        else:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            if one:
                so.intra_op_num_threads = 1
            o = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            runs[side] = lambda f, o=o: o.run(None, f)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab, (1, max(prompts)), dtype=np.int64)
    phases = {f"prefill{p}": prefill_feeds(config, ids[:, :p]) for p in prompts}
    ort_out = dict(zip(names, ref.run(None, phases[f"prefill{max(prompts)}"])))
    phases["decode"] = decode_feeds(config, int(ort_out["logits"][0, -1].argmax()), ort_out)
    res: dict = {"accuracy_level": config.accuracy_level, "embedding": config.embedding, "phases": {}}
    for phase, feeds in phases.items():
        expected = ref.run(None, feeds)[0]
        row: dict = {}
        if "ours" in runs:
            got = runs["ours"](feeds)[0]
            row["rel_err"] = float(np.abs(got - expected).max() / np.abs(expected).max())
        t = interleaved({k: (lambda f=feeds, r=r: r(f)) for k, r in runs.items()}, repeat)
        row.update({f"{k}_ms": v * 1e3 for k, v in t.items()})
        if "ours" in t and "ort" in t:
            row["ratio"] = t["ours"] / t["ort"]
        if "ours-1t" in t and "ort-1t" in t:
            row["ratio_1t"] = t["ours-1t"] / t["ort-1t"]
        if "ours" in t and "ours-1t" in t:
            row["threads_speedup"] = t["ours-1t"] / t["ours"]
        row["load_avg"] = C.machine()["load_avg"]
        res["phases"][phase] = row
    if want_profile and "ours" in sides:
        ours = RuntimeSession(path)
        ours.prepare()
        res["profile"] = {ph: profile(ours, f, max(3, repeat // 4)) for ph, f in phases.items()}
        ours.close()
    for c in closers:
        c()
    res["load_avg_before"], res["load_avg_after"] = load_before, C.machine()["load_avg"]
    return res


def run(models: list[str], levels: list[int], prompts: list[int], repeat: int, sides: list[str],
        want_profile: bool, models_dir: str) -> dict:
    rows = []
    for model in models:
        for level in levels:
            path = model_path(models_dir, model, level)
            r = bench_model(path, prompts, repeat, sides, want_profile)
            for phase, p in r["phases"].items():
                goal = GOALS.get(phase) if level == 4 else None
                rows.append({"model": model, "level": level, "phase": phase, **p, "goal": goal,
                             "meets": (p["ratio"] <= goal) if goal is not None and "ratio" in p else None})
            if "profile" in r:
                rows[-1]["profile"] = r["profile"]
    return {"benchmark": "llm", "machine": C.machine(), "prompts": prompts, "repeat": repeat, "sides": sides,
            "goals": GOALS, **_native_info(), "rows": rows}


# **** output ****


def printer(res: dict) -> None:
    m = res["machine"]
    print(f"whole-model INT4 LLM, hot path; cpus {m['cpu_count']}; native kernels: {res.get('native')}; "
          f"medians of {res['repeat']} interleaved runs per side; decode = 1 token after {max(res['prompts'])}")
    cols = [("model", "model", ""), ("acc", "level", "d"), ("phase", "phase", "")]
    for side in res["sides"]:
        cols.append((f"{side} ms", f"{side}_ms", ".2f"))
    cols += [("x ort", "ratio", ".2f"), ("x ort 1t", "ratio_1t", ".2f"), ("1t/all", "threads_speedup", ".2f"),
             ("goal", "goal", ".1f"), ("meets", "meets", ""), ("rel err", "rel_err", ".1e"),
             ("load avg", "load_avg", "")]
    print(C.table(res["rows"], cols))
    print("x ort = ours / onnxruntime (default threads); x ort 1t = both at intra_op_num_threads=1; 1t/all = our "
          "1-thread time / our all-threads time; rel err = max|ours - ort| / max|ort| of the logits; goals at "
          f"level 4: {', '.join(f'{k} <= {v}' for k, v in res['goals'].items())}")
    for r in res["rows"]:
        for phase, p in (r.get("profile") or {}).items():
            if "error" in p:
                print(f"\nprofile unavailable: {p['error']}")
                continue
            print(f"\n{r['model']} acc{r['level']} {phase}: run {p['run_ms']:.2f} ms (timed kernels), outside "
                  f"kernels {p['outside_kernels_ms']:.2f} ms; top op types: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in list(p["op_types_ms"].items())[:5]))
            for op, ms in list(p["ops_ms"].items())[:8]:
                print(f"  {op:34s} {ms:9.3f} ms  {ms / p['run_ms'] * 100:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=C.parse_list, default=["medium", "medium-genai"])
    ap.add_argument("--levels", type=lambda s: [int(x) for x in C.parse_list(s)], default=[0, 4])
    ap.add_argument("--prompts", type=lambda s: [int(x) for x in C.parse_list(s)], default=[16, 128])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sides", type=C.parse_list, default=list(SIDES))
    ap.add_argument("--profile", action="store_true", help="our time per op (every phase), after the timing")
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    bad = [m for m in a.models if m not in MODELS] + [s for s in a.sides if s not in SIDES]
    if bad or a.repeat < 1 or not a.prompts or min(a.prompts) < 1:
        ap.error(f"unknown models/sides {bad}, or non-positive repeat/prompts")
    res = run(a.models, a.levels, a.prompts, a.repeat, a.sides, a.profile, a.models_dir)
    C.emit(res, a.json, printer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
