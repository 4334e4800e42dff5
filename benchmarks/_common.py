"""Shared helpers of the prepared-execution benchmarks: cached models, page cache, child processes, stats.

Only the standard library is imported at module level: child processes import this module before
they time ``import numpy`` / ``import onnx_prepared`` / ``import onnxruntime``.

Models are generated once into ``--models-dir`` (default ``~/.cache/onnx-prepared/bench``) and never
rewritten: a folder whose model file exists is reused as is (the generator writes the model file last,
atomically, so its presence means the data file is complete).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import mmap
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

MODELS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "onnx-prepared", "bench")
MB = 1 << 20
_PAGE = mmap.PAGESIZE

# **** models ****


def tiny_llm_path(models_dir: str, preset: str) -> str:
    """The cached tiny-llm of ``preset`` ("tiny", "medium", "large"), generated on first use."""
    from onnx_prepared.generate import MODEL_FILE, generate_tiny_llm

    out = os.path.join(models_dir, preset)
    path = os.path.join(out, MODEL_FILE)
    if not os.path.exists(path):
        print(f"[bench] generating tiny-llm preset {preset!r} into {out} (once)", file=sys.stderr)
        generate_tiny_llm(out, preset=None if preset == "tiny" else preset)
    return path


def gemm_mlp_path(models_dir: str, layers: int = 8, width: int = 128) -> str:
    """A small Gemm+Relu MLP with external weights: per-run overhead dominates its compute."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    out = os.path.join(models_dir, f"gemm-mlp-{layers}x{width}")
    path = os.path.join(out, "mlp.onnx")
    if os.path.exists(path):
        return path
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / math.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal(width) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        y = f"h{i}" if i < layers - 1 else "y"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}" if i < layers - 1 else y],
                                      name=f"gemm{i}", transB=1))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [f"g{i}"], [y], name=f"relu{i}"))
        prev = y
    graph = helper.make_graph(nodes, "gemm_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    tmp = path + ".tmp"
    onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.data",
                    size_threshold=0)
    os.replace(tmp, path)
    return path


def model_files(path: str) -> list[str]:
    """The model file and every external-data file next to it (what a cold run must evict)."""
    folder = os.path.dirname(path)
    return [path] + sorted(os.path.join(folder, f) for f in os.listdir(folder)
                           if f.endswith((".data", ".bin")) and os.path.isfile(os.path.join(folder, f)))


def llm_dims(path: str) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) from the generator's genai_config.json (no onnx import)."""
    with open(os.path.join(os.path.dirname(path), "genai_config.json")) as f:
        d = json.load(f)["model"]["decoder"]
    return d["num_hidden_layers"], d["num_key_value_heads"], d["head_size"]


def llm_prefill_feeds(path: str, tokens: int) -> dict:
    """Prefill feeds (numpy only): ``tokens`` deterministic ids, empty KV-cache."""
    import numpy as np

    layers, kv, hd = llm_dims(path)
    ids = (np.arange(tokens, dtype=np.int64) * 7919 % 1000 + 3)[None, :]
    feeds = {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64)}
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, kv, 0, hd), np.float32)
    return feeds


# **** page cache ****


def evict(paths: Iterable[str]) -> None:
    """Drop the files' (clean) pages from the page cache: ``posix_fadvise(DONTNEED)``."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Iterable[str]) -> None:
    """Read the files once so every page is cached."""
    buf = bytearray(16 * MB)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            off = 0
            while n := os.preadv(fd, [buf], off):
                off += n
        finally:
            os.close(fd)


_libc: Any = None


def resident_fraction(paths: Iterable[str]) -> float | None:
    """Fraction of the files' pages in the page cache (``mincore``, byte-weighted); None if unavailable."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        _libc = ctypes.CDLL(name, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_long]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    resident = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + _PAGE - 1) // _PAGE
                vec = ctypes.create_string_buffer(pages)
                if _libc.mincore(addr, size, vec) != 0:
                    return None
                resident += sum(b & 1 for b in vec.raw) * _PAGE
                total += pages * _PAGE
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else 1.0


def compile_package() -> None:
    """Write onnx_prepared's .pyc files, as ``pip install`` of a wheel does, before fresh child processes
    import it: this environment sets PYTHONDONTWRITEBYTECODE, so an uncompiled tree is compiled again by
    every child (~60-80 ms of a session's import and construction here), which no installed copy pays."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("onnx_prepared")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            compileall.compile_dir(folder, quiet=1)


def set_cache(paths: list[str], cache: str) -> float | None:
    """Put the files in the page-cache state ``cache`` ("cold" or "warm"); returns the resident fraction."""
    if cache == "cold":
        evict(paths)
    else:
        warm(paths)
    return resident_fraction(paths)


# **** child processes ****


def package_root() -> str | None:
    """The folder holding the ``onnx_prepared`` this process imports (a worktree's, when run from it).

    NOTE: a child started as ``python benchmarks/X.py`` has the script's folder, not the working
    directory, first on its path, so without this it imported the installed (editable) package, main's
    tree, while the parent ran a worktree's: every child-process benchmark run from a worktree measured
    main's code. The children get this folder first on ``PYTHONPATH``.
    """
    import importlib.util

    spec = importlib.util.find_spec("onnx_prepared")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(next(iter(spec.submodule_search_locations))))


def run_child(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 900.0) -> dict:
    """Run ``python *args --spawn T`` in a fresh process (importing the parent's ``onnx_prepared``:
    :func:`package_root`); returns the JSON object it printed last.

    ``T`` is ``time.perf_counter()`` just before the spawn: CLOCK_MONOTONIC is system-wide on Linux,
    so the child can time its phases from the moment its process was started.
    """
    full_env = dict(os.environ)
    root = package_root()
    if root is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, full_env.get("PYTHONPATH")) if p)
    full_env.update(env or {})
    t_spawn = time.perf_counter()
    p = subprocess.run([sys.executable, *args, "--spawn", repr(t_spawn)], capture_output=True, text=True,
                       env=full_env, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"child {' '.join(args)} printed no JSON:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(lines[-1])


def child_print(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def max_rss_mb() -> float:
    """Peak RSS of this process in MB: ``VmHWM`` (``ru_maxrss`` is inherited across exec from the parent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# **** statistics and intervals ****


def median(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def pct(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank; nan for no data."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def rotate(seq: Sequence[Any], i: int) -> list[Any]:
    """``seq`` rotated by ``i``: interleaved repetitions never run one variant always first."""
    k = i % len(seq) if seq else 0
    return list(seq[k:]) + list(seq[:k])


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted disjoint union of ``[start, end)`` intervals."""
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(u: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in u)


def intersect(u: list[tuple[float, float]], v: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two sorted disjoint unions."""
    out, i, j = [], 0, 0
    while i < len(u) and j < len(v):
        a, b = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        if b > a:
            out.append((a, b))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(u: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return intersect(u, [(lo, hi)]) if hi > lo else []


def max_concurrent_bytes(spans: Iterable[tuple[float, float, int]]) -> int:
    """Maximum over time of the summed bytes of spans ``(start, end, bytes)`` in progress."""
    events = []
    for a, b, n in spans:
        events.append((a, 1, n))
        events.append((b, 0, -n))  # at equal times, ends (0) sort before starts (1)
    cur = best = 0
    for _, _, n in sorted(events):
        cur += n
        best = max(best, cur)
    return best


# **** output ****


def machine() -> dict:
    return {"cpu_count": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0]}


def fmt(v: Any, spec: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if spec:
        return format(v, spec)
    return str(v)


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns``: (header, key, format spec). Right-aligned except the first column."""
    cells = [[h for h, _, _ in columns]] + [[fmt(r.get(k), s) for _, k, s in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = []
    for c in cells:
        lines.append("  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(len(c))))
    return "\n".join(lines)


def emit(result: dict, as_json: bool, printer) -> None:
    if as_json:
        json.dump(result, sys.stdout)
        print()
    else:
        printer(result)


def parse_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]
