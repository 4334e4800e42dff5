"""The native extension's wrapper: dispatch levels and their environment override, the numpy fallback when
the extension is off, the thread pool (thread counts give bit-identical results; concurrent callers)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from onnx_prepared.kernels import matmul_nbits as mm
from onnx_prepared.kernels import native

needs_ext = pytest.mark.skipif(not native.available(), reason=f"native extension: {native.unavailable_reason}")

_PROBE = """
import numpy as np
from onnx_prepared.kernels import matmul_nbits as mm, native
rng = np.random.default_rng(0)
B = rng.integers(0, 256, (20, 3, 16), dtype=np.uint8)
S = rng.random((20, 3), dtype=np.float32)
A = rng.standard_normal((3, 90)).astype(np.float32)
(y,) = mm.matmul_nbits(A, B, S, K=90, N=20, block_size=32, accuracy_level=4)
print(native.dispatch_level(), native.available(), float(np.abs(y).sum()))
"""


def _probe(**env) -> list[str]:
    e = {k: v for k, v in os.environ.items() if k not in (native.ISA_ENV, native.DISABLE_ENV)} | env
    out = subprocess.run([sys.executable, "-c", _PROBE], env=e, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_extension_off_runs_on_numpy_with_the_same_result():
    off = _probe(**{native.DISABLE_ENV: "0"})
    assert off[:2] == ["numpy", "False"]
    if native.available():
        on = _probe()
        assert on[0] == native.supported_levels()[-1] and on[1] == "True"
        assert abs(float(on[2]) - float(off[2])) <= 1e-5 * abs(float(off[2]))


@needs_ext
@pytest.mark.parametrize("level", native.supported_levels())
def test_environment_forces_a_lower_level(level):
    assert _probe(**{native.ISA_ENV: level})[0] == level


@needs_ext
def test_unknown_or_unsupported_level_is_refused():
    with pytest.raises(native.NativeConfigError, match="not a dispatch level"):
        native.set_dispatch_level("sse9")
    if native.supported_levels()[-1] != native.LEVELS[-1]:
        with pytest.raises(native.NativeConfigError, match="not supported by this CPU"):
            native.set_dispatch_level(native.LEVELS[-1])
    e = {k: v for k, v in os.environ.items()} | {native.ISA_ENV: "sse9"}
    out = subprocess.run([sys.executable, "-c", "import onnx_prepared.kernels.native"], env=e, capture_output=True,
                         text=True, check=False)
    assert out.returncode != 0 and "ONNX_PREPARED_ISA='sse9'" in out.stderr


@needs_ext
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc")
def test_pool_workers_are_named_for_the_benchmarks():
    """benchmarks/kernels_nbits.py finds the pool's workers by their name to read their run-queue waits"""
    from benchmarks.kernels_nbits import POOL_THREAD_NAME, pool_queue_wait_ns

    rng = np.random.default_rng(1)
    packed = mm.prepack_matmul_nbits(rng.integers(0, 256, (256, 32, 16), dtype=np.uint8),
                                     rng.random((256, 32), dtype=np.float32), None, K=1024, N=256, bits=4,
                                     block_size=32)
    before = native.get_num_threads()
    native.set_num_threads(2)
    A = rng.standard_normal((64, 1024)).astype(np.float32)

    def names():
        out = []
        for t in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{t}/comm") as f:
                out.append(f.read().strip())
        return out

    try:  # a worker names itself when it first runs, which may be after the call that started it
        deadline = time.monotonic() + 10
        while POOL_THREAD_NAME not in names() and time.monotonic() < deadline:
            mm.matmul_nbits_packed(A, packed, accuracy_level=4)
        assert POOL_THREAD_NAME in names()
        assert pool_queue_wait_ns() >= 0
    finally:
        native.set_num_threads(before)


def test_describe_names_kernels_and_level():
    line = native.describe()
    assert line.startswith("native kernels:") and native.dispatch_level() in line


def _case(rng, M=64, K=1024, N=512):
    B = rng.integers(0, 256, (N, K // 32, 16), dtype=np.uint8)
    S = (rng.random((N, K // 32), dtype=np.float32) * 0.1).astype(np.float32)
    packed = mm.prepack_matmul_nbits(B, S, None, K=K, N=N, bits=4, block_size=32)
    return rng.standard_normal((M, K)).astype(np.float32), packed


@needs_ext
@pytest.mark.parametrize("level", [0, 4])
def test_thread_count_does_not_change_a_bit(level):
    rng = np.random.default_rng(1)
    A, packed = _case(rng)
    before = native.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            native.set_num_threads(n)
            assert native.get_num_threads() == n
            outs.append(mm.matmul_nbits_packed(A, packed, accuracy_level=level)[0])
    finally:
        native.set_num_threads(before)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])
    with pytest.raises(native.NativeConfigError):
        native.set_num_threads(0)


@needs_ext
def test_concurrent_callers_get_their_own_results():
    """Several Python threads at once: one holds the pool, the others run single-threaded beside it."""
    rng = np.random.default_rng(2)
    cases = [_case(rng, M=m) for m in (1, 16, 33, 64)]
    want = [mm.matmul_nbits_packed(A, p, accuracy_level=4)[0] for A, p in cases]
    got: dict[int, list] = {}
    start = threading.Barrier(len(cases))

    def work(i):
        A, p = cases[i]
        start.wait()
        got[i] = [mm.matmul_nbits_packed(A, p, accuracy_level=4)[0] for _ in range(20)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, w in enumerate(want):
        for y in got[i]:
            np.testing.assert_array_equal(y, w)


def test_read_sum_probe():
    buf = np.arange(1 << 16, dtype=np.uint64)
    assert native.read_sum(buf.view(np.uint8)) == int(buf.sum())


def test_inspect_prints_the_dispatch_line(capsys):
    from onnx_prepared.cli import main

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "genai_int4",
                        "model.onnx")
    assert main(["inspect", path]) == 0
    assert f"native kernels: {native.describe().split(': ', 1)[1]}" in capsys.readouterr().out


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@needs_ext
@pytest.mark.skipif(_cpu_flags() is None or "avx2" not in (_cpu_flags() or ()), reason="not an x86 CPU with AVX2")
def test_avx2vnni_is_a_supported_level_only_where_the_cpu_has_avx_vnni():
    """A CPU with AVX-512 VNNI but no AVX-VNNI (VEX; AMD Zen 4) runs neither avx2vnni's kernels nor a
    forced avx2vnni: the level is not offered, and forcing it is refused instead of dying of SIGILL."""
    has = "avx_vnni" in _cpu_flags()
    assert ("avx2vnni" in native.supported_levels()) == has
    if not has:
        with pytest.raises(native.NativeConfigError, match="not supported by this CPU"):
            native.set_dispatch_level("avx2vnni")
