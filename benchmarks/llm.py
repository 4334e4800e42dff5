"""Tiny INT4 LLM, steady state: prefill and KV-cache decode, ours vs onnxruntime side by side in one process.

Per preset (``tiny``, ``medium``) and MatMulNBits accuracy level (0: onnxruntime computes in fp32 like us;
4: the generator's default, onnxruntime quantizes activations to int8), on the same feeds:

- ``prefill``: batch 1, ``--prompt`` (128) tokens, empty KV cache;
- ``decode``: one token after a past of ``--prompt`` positions (onnxruntime's prefill presents as past).

``ours`` is :class:`~onnx_prepared.runtime.RuntimeSession` after ``prepare()`` (every weight prepacked, hot
path); ``ours-blas1`` is the same session with OpenBLAS limited to one
thread (set at run time through numpy's bundled OpenBLAS; ``-`` when that library is not found). onnxruntime
runs with default session options (``intra_op_num_threads`` default = one thread per core). Times are
medians of interleaved rounds; a loaded machine slows every side alike, so read the ratios. The issue's goals:
prefill <= 1.5x onnxruntime's time, decode step <= 2x.

``--profile`` adds where ours spends a run: kernel time per op (hot-path kernels wrapped with a timer)
and what is left outside the kernels (feed checks, scheduler hand-off, outputs).

    python benchmarks/llm.py [--presets tiny,medium] [--levels 0,4] [--prompt 128] [--repeat 20] [--profile]
                             [--json] [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import os
import statistics
import sys
import time
from collections import defaultdict

import _common as C

GOALS = {"prefill": 1.5, "decode": 2.0}


# **** models and feeds ****


def model_path(models_dir: str, preset: str, level: int) -> str:
    """The cached model: level 4 is the shared ``<preset>`` folder, other levels ``<preset>-acc<level>``."""
    if level == 4:
        return C.tiny_llm_path(models_dir, preset)
    from onnx_prepared.generate import MODEL_FILE, generate_tiny_llm

    out = os.path.join(models_dir, f"{preset}-acc{level}")
    path = os.path.join(out, MODEL_FILE)
    if not os.path.exists(path):
        print(f"[bench] generating tiny-llm preset {preset!r} accuracy_level {level} into {out} (once)",
              file=sys.stderr)
        generate_tiny_llm(out, preset=None if preset == "tiny" else preset, accuracy_level=level)
    return path


# **** OpenBLAS threads ****


def _openblas_lib():
    import numpy as np

    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*.so*")):
        return ctypes.CDLL(path)
    return None


def _openblas():
    """numpy's bundled OpenBLAS (set/get num threads), or None."""
    lib = _openblas_lib()
    for prefix, suffix in (("scipy_openblas_", "64_"), ("scipy_openblas_", "_64_"), ("openblas_", "")):
        set_name, get_name = f"{prefix}set_num_threads{suffix}", f"{prefix}get_num_threads{suffix}"
        if lib is not None and hasattr(lib, set_name) and hasattr(lib, get_name):
            return getattr(lib, set_name), getattr(lib, get_name)
    return None


def openblas_core() -> str | None:
    """The kernel family OpenBLAS picked at run time (e.g. ``Haswell`` = AVX2, ``SkylakeX`` = AVX-512)."""
    lib = _openblas_lib()
    for name in ("scipy_openblas_get_corename64_", "openblas_get_corename"):
        if lib is not None and hasattr(lib, name):
            f = getattr(lib, name)
            f.restype = ctypes.c_char_p
            return f().decode()
    return None


@contextlib.contextmanager
def blas_threads(n: int | None):
    lib = _openblas() if n else None
    if lib is None:
        yield
        return
    set_n, get_n = lib
    before = get_n()
    set_n(n)
    try:
        yield
    finally:
        set_n(before)


# **** timing ****


def interleaved(fns: dict, repeat: int, rounds: int = 5) -> dict[str, float]:
    """Median seconds per function; functions alternate in rounds of ``repeat // rounds`` calls (so each
    side's spinning worker threads are charged to itself, not to the next call)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    per = max(1, repeat // rounds)
    for _ in range(rounds):
        for k, (fn, setup) in fns.items():
            with setup():
                fn()
                for _ in range(per):
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


@contextlib.contextmanager
def timed_kernels(plan, acc: dict[str, float]):
    """Wrap every hot-path kernel call of ``plan`` (an ExecutionPlan) with a timer summing into ``acc``.

    NOTE: patches the plan's derived ``steps`` (what ``replay`` iterates) and restores them on exit.
    """
    orig = plan.steps  # AttributeError when the plan no longer derives steps: profile() reports it

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
    """Ours: mean ms per run, per op label, plus ``outside kernels``."""
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
    return {"run_ms": total / reps * 1e3, "ops_ms": ops,
            "outside_kernels_ms": (total - sum(acc.values())) / reps * 1e3}


# **** one model ****


def bench_model(path: str, prompt: int, repeat: int, want_profile: bool) -> dict:
    import numpy as np
    import onnxruntime as ort

    from onnx_prepared.generate import TinyLlmConfig, decode_feeds, prefill_feeds
    from onnx_prepared.runtime import RuntimeSession

    config = TinyLlmConfig.from_model(path)
    ours = RuntimeSession(path)
    ours.prepare()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ort_sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in ort_sess.get_outputs()]

    ids = np.random.default_rng(0).integers(0, config.vocab, (1, prompt), dtype=np.int64)
    pre = prefill_feeds(config, ids)
    ort_out = dict(zip(names, ort_sess.run(None, pre)))
    ours_out = dict(zip(names, ours.run(pre)))
    token = int(ort_out["logits"][0, -1].argmax())
    dec = decode_feeds(config, token, ort_out)
    rel = float(np.abs(ours_out["logits"] - ort_out["logits"]).max() / np.abs(ort_out["logits"]).max())

    none = contextlib.nullcontext
    has_blas = _openblas() is not None
    res = {"accuracy_level": config.accuracy_level, "prefill_rel_err": rel}
    for phase, feeds in (("prefill", pre), ("decode", dec)):
        fns = {"ours": (lambda f=feeds: ours.run(f), none),
               "ort": (lambda f=feeds: ort_sess.run(None, f), none)}
        if has_blas:
            fns["ours_blas1"] = (lambda f=feeds: ours.run(f), lambda: blas_threads(1))
        t = interleaved(fns, repeat)
        res[f"{phase}_ours_ms"] = t["ours"] * 1e3
        res[f"{phase}_ort_ms"] = t["ort"] * 1e3
        res[f"{phase}_ratio"] = t["ours"] / t["ort"]
        res[f"{phase}_ours_blas1_ms"] = t["ours_blas1"] * 1e3 if has_blas else None
        res[f"{phase}_blas1_ratio"] = t["ours_blas1"] / t["ort"] if has_blas else None
        if want_profile:
            res[f"{phase}_profile"] = profile(ours, feeds, max(3, repeat // 4))
            if has_blas:
                with blas_threads(1):
                    res[f"{phase}_profile_blas1"] = profile(ours, feeds, max(3, repeat // 4))
    ours.close()
    return res


def run(presets: list[str], levels: list[int], prompt: int, repeat: int, want_profile: bool, models_dir: str) -> dict:
    rows = []
    for preset in presets:
        for level in levels:
            path = model_path(models_dir, preset, level)
            rows.append({"preset": preset, **bench_model(path, prompt, repeat, want_profile)})
    return {"machine": C.machine(), "prompt": prompt, "repeat": repeat, "goals": GOALS,
            "openblas_core": openblas_core(), "rows": rows}


# **** output ****


def printer(res: dict) -> None:
    m = res["machine"]
    print(f"cpus {m['cpu_count']}, load avg {m['load_avg']}; OpenBLAS core "
          f"{res.get('openblas_core')}; prefill {res['prompt']} tokens, "
          f"decode 1 token after {res['prompt']}; medians of {res['repeat']} interleaved runs")
    cols = [("preset", "preset", ""), ("acc", "accuracy_level", "d"),
            ("prefill ours ms", "prefill_ours_ms", ".2f"), ("ort ms", "prefill_ort_ms", ".2f"),
            ("x ort", "prefill_ratio", ".2f"), ("blas1 ms", "prefill_ours_blas1_ms", ".2f"),
            ("x ort (b1)", "prefill_blas1_ratio", ".2f"),
            ("decode ours ms", "decode_ours_ms", ".3f"), ("ort ms", "decode_ort_ms", ".3f"),
            ("x ort", "decode_ratio", ".2f"), ("blas1 ms", "decode_ours_blas1_ms", ".3f"),
            ("x ort (b1)", "decode_blas1_ratio", ".2f"), ("rel err", "prefill_rel_err", ".1e")]
    print(C.table(res["rows"], cols))
    print(f"goals: prefill <= {GOALS['prefill']}x onnxruntime, decode <= {GOALS['decode']}x "
          "(x ort = our time / onnxruntime's; blas1, b1 = ours with OpenBLAS at 1 thread; rel err = max|ours - ort| / "
          "max|ort| of the prefill logits)")
    for r in res["rows"]:
        for key in ("prefill_profile", "prefill_profile_blas1", "decode_profile", "decode_profile_blas1"):
            p = r.get(key)
            if not p:
                continue
            if "error" in p:
                print(f"\nprofile unavailable: {p['error']}")
                continue
            print(f"\n{r['preset']} acc{r['accuracy_level']} {key.replace('_profile', '')}: run {p['run_ms']:.2f} ms "
                  f"(timed kernels), outside kernels {p['outside_kernels_ms']:.2f} ms")
            for op, ms in list(p["ops_ms"].items())[:10]:
                print(f"  {op:32s} {ms:9.3f} ms  {ms / p['run_ms'] * 100:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,medium")
    ap.add_argument("--levels", default="0,4", help="MatMulNBits accuracy levels to generate and compare")
    ap.add_argument("--prompt", type=int, default=128, help="prefill tokens = past length of the decode step")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="per-op time of ours (prefill and decode)")
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(C.parse_list(a.presets), [int(x) for x in C.parse_list(a.levels)], a.prompt, a.repeat, a.profile,
              a.models_dir)
    C.emit(res, a.json, printer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
