"""kill -9 at every publication step of a cache flush, in a loop (issue 14, deliverable 7).

One cache folder lives through the whole loop: it starts with a session's companion (a Gemm MLP with
external data), then each round forks a writer that adds entries to it and stops at one step of the
flush (a patched ``os`` call or ``cache_io.checkpoint``); the writer reports the step on a pipe and
blocks on another pipe, and the test SIGKILLs it there. No sleep is used as synchronization.

After every kill: ``cache verify`` passes, the store opens with no invalid entry, the visible
generation is the previous complete one or the new complete one (which one follows from the step),
every entry's bytes are the ones written (a partial entry is never visible, so never a hit), a
read_only session gives bytes identical to a session without cache, and ``cache gc`` removes every
leftover temporary or unreferenced file.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import sys

import numpy as np
import pytest

from onnx_prepared.prepared import cache_io
from onnx_prepared.prepared.cache import (
    PreparedModelStore,
    collect_garbage,
    source_model_digest,
    verify,
)
from onnx_prepared.resolve.keys import PreparedKey
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import gemm_mlp

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX fork only")

X = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
ROUNDS = 3
SIZES = (70_000, 3)  # the two payloads of each writer: bytes
#: steps after which the new manifest is visible
PUBLISHED = {"manifest_replaced", "cleanup_unlink", "flushed"}
STEPS = [
    "pwrite",  # inside the payload write, at a random byte offset
    "payload_fsync",  # before fsync of the temporary data file
    "data_written",  # payloads written and fsync-ed
    "locked",  # exclusive lock taken
    "data_rename",  # before the temporary data file is renamed
    "data_renamed",  # renamed, folder not yet fsync-ed
    "data_published",
    "manifest_merge",  # manifest on disk read for the merge, under the lock
    "manifest_write",  # temporary manifest half written
    "manifest_written",  # temporary manifest fsync-ed
    "manifest_replace",  # before os.replace
    "manifest_replaced",
    "cleanup_unlink",  # cleanup under the lock removed its first orphan
    "flushed",  # flush returned
]
POLL_LIMIT = 60.0  # seconds: a bound on waiting for the child, never a delay


def key(name: str) -> PreparedKey:
    return PreparedKey((name,), "L", "cpu", hashlib.sha256(name.encode()).hexdigest())


def payload(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _writer(path: str, src: str, step: str, offset: int, entries, report: int, gate: int) -> None:
    """Child: add ``entries``, flush, stop at ``step``. Never returns (os._exit or SIGKILL)."""
    real = {n: getattr(os, n) for n in ("pwrite", "fsync", "rename", "write", "replace", "unlink")}
    real_read_index = cache_io.read_index

    def stop() -> None:
        real["write"](report, step.encode() + b"\n")
        os.read(gate, 1)  # the test never writes: blocks until SIGKILL
        os._exit(3)

    written = [0]

    def pwrite(fd, data, off):
        mv = memoryview(data).cast("B")
        if written[0] + len(mv) >= offset:
            real["pwrite"](fd, mv[:offset - written[0]], off)
            stop()
        written[0] += len(mv)
        return real["pwrite"](fd, mv, off)

    def fsync(fd):
        stop()

    def rename(a, b):
        if step == "data_rename":
            stop()
        real["rename"](a, b)
        stop()

    def write(fd, data):
        mv = memoryview(data).cast("B")
        real["write"](fd, mv[:len(mv) // 2])
        stop()

    def replace(a, b):
        stop()

    def unlink(p):
        real["unlink"](p)
        stop()

    def read_index(p):
        out = real_read_index(p)
        stop()
        return out

    def checkpoint(stage):
        if stage == step:
            stop()

    try:
        store = PreparedModelStore(path, source_digest=src, policy="build_if_missing")
        for name, seed, n in entries:
            store.put(key(name), payload(seed, n))
        cache_io.checkpoint = checkpoint
        hook = {"pwrite": ("pwrite", pwrite), "payload_fsync": ("fsync", fsync), "data_rename": ("rename", rename),
                "data_renamed": ("rename", rename), "manifest_write": ("write", write),
                "manifest_replace": ("replace", replace), "cleanup_unlink": ("unlink", unlink)}.get(step)
        if hook is not None:
            setattr(os, *hook)
        if step == "manifest_merge":
            cache_io.read_index = read_index
        store.flush()
        if step == "flushed":
            stop()
    except BaseException as e:  # the child must never return into pytest
        real["write"](report, f"error {type(e).__name__}: {e}\n".encode())
    os._exit(4)


def kill_at(path: str, src: str, step: str, offset: int, entries) -> str:
    report_r, report_w = os.pipe()
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(report_r)
            _writer(path, src, step, offset, entries, report_w, gate_r)
        finally:
            os._exit(5)
    os.close(report_w)
    try:
        ready, _, _ = select.select([report_r], [], [], POLL_LIMIT)
        said = os.read(report_r, 4096).decode().strip() if ready else "timeout"
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        for fd in (report_r, gate_r, gate_w):
            os.close(fd)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (step, said, status)
    return said


def plant_orphans(folder, root: str, i: int) -> set[str]:
    """What a dead writer and a superseded generation leave: cleanup and gc must remove them."""
    names = {f".{root}.{i:016x}.data.tmp", f".{root}.{i:016x}.onnx.tmp", f"{root}.{i + 1:016x}.data"}
    for n in names:
        (folder / n).write_bytes(b"\0" * 100)
    return names


def test_sigkill_at_every_publication_step_in_a_loop(tmp_path):
    (tmp_path / "m").mkdir()
    model = gemm_mlp(tmp_path / "m", layers=3)
    folder = tmp_path / "c"
    path = str(folder / "m.prepared.onnx")
    root = "m.prepared"
    src = source_model_digest(model)
    with RuntimeSession(model, {"prepared_model_policy": "disabled"}) as s:
        (want_y,) = s.run({"x": X})
    with RuntimeSession(model, {"prepared_model_policy": "build_if_missing", "prepared_model_path": path}) as s:
        (y,) = s.run({"x": X})
    assert y.tobytes() == want_y.tobytes()
    with PreparedModelStore(path, source_digest=src, policy="read_only") as st:
        gen = st.generation
        model_entries = set(st.entries())
    assert gen >= 1 and model_entries
    want: dict[str, tuple[int, int]] = {}  # entry -> (seed, size) of everything published so far
    rng = np.random.default_rng(14)
    kills = outcomes_new = outcomes_old = 0
    for r in range(ROUNDS):
        for j, step in enumerate(STEPS):
            i = r * len(STEPS) + j
            entries = [(f"k{i}a", 2 * i, SIZES[0]), (f"k{i}b", 2 * i + 1, SIZES[1])]
            offset = int(rng.integers(1, SIZES[0] + 1))
            orphans = plant_orphans(folder, root, 2 * i)
            said = kill_at(path, src, step, offset, entries)
            assert said == step, said
            kills += 1
            published = step in PUBLISHED
            if published:
                want.update({n: (seed, size) for n, seed, size in entries})
                gen += 1
                outcomes_new += 1
            else:
                outcomes_old += 1
            # the folder is usable, and shows exactly the previous or the new complete generation
            assert verify(path) == [], step
            with PreparedModelStore(path, source_digest=src, policy="read_only") as st:
                assert st.invalid == {} and st.generation == gen, (step, st.generation, gen)
                got = st.entries()
                ours = {e.lineage[0]: e for n, e in got.items() if n not in model_entries}
                assert model_entries <= set(got) and set(ours) == set(want), step
                for n, (seed, size) in want.items():
                    assert st.read_payload(ours[n]).tobytes() == payload(seed, size).tobytes(), (step, n)
                for n in model_entries:
                    st.read_payload(got[n])  # length, identity record and sha256 checked
                referenced = {e.location for e in got.values()}
            # a following session gives the bytes of a session without cache
            with RuntimeSession(model, {"prepared_model_policy": "read_only", "prepared_model_path": path}) as s:
                (y,) = s.run({"x": X})
            assert y.tobytes() == want_y.tobytes(), step
            # leftovers (the dead writer's, and the planted orphans the flush did not reach) go with gc
            before = set(os.listdir(folder))
            removed = set(collect_garbage(path))
            keep = {"m.prepared.onnx", "m.prepared.lock", *referenced}
            assert set(os.listdir(folder)) == keep, step
            assert removed == before - keep, step
            if step != "cleanup_unlink" and not published:
                assert orphans <= removed, step
    assert kills == ROUNDS * len(STEPS) == 42 and (outcomes_old, outcomes_new) == (33, 9)
    # after all of it the cache still takes a new generation
    with PreparedModelStore(path, source_digest=src, policy="build_if_missing") as st:
        st.put(key("after"), payload(999, 10))
        assert st.flush() == 1
    assert verify(path) == []
