"""Companion cache across processes: a writer SIGKILLed at any step, and two builders at once.

Each child process stops at a named flush step (``cache_io.checkpoint``) and waits on a gate file the
test creates; the test waits for the child's "reached" file. Waiting is bounded polling of files,
never a sleep used as synchronization.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from onnx_prepared.prepared.cache import PreparedModelPolicy, PreparedModelStore, verify
from onnx_prepared.resolve.keys import PreparedKey

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL") or sys.platform == "win32", reason="POSIX only")

SRC = hashlib.sha256(b"source model").hexdigest()
POLL_LIMIT = 60.0  # seconds; a bound on polling, never a synchronization delay

CHILD = r"""
import hashlib, json, os, sys, time
import numpy as np
from onnx_prepared.prepared import cache_io
from onnx_prepared.prepared.cache import PreparedModelStore
from onnx_prepared.resolve.keys import PreparedKey

cfg = json.loads(sys.argv[1])

def checkpoint(stage):
    if stage == cfg["stage"]:
        open(cfg["reached"], "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(cfg["go"]):
            if time.monotonic() > deadline:
                sys.exit("gate never opened")
            time.sleep(0.002)

cache_io.checkpoint = checkpoint
store = PreparedModelStore(cfg["path"], source_digest=cfg["src"], policy="build_if_missing")
for name, seed, n in cfg["entries"]:
    k = PreparedKey((name,), "L", "cpu", hashlib.sha256(name.encode()).hexdigest())
    store.put(k, np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))
store.record_source_digest(cfg["entries"][0][0], hashlib.sha256(b"digest").hexdigest())
print(store.flush())
"""


def k(name: str) -> PreparedKey:
    return PreparedKey((name,), "L", "cpu", hashlib.sha256(name.encode()).hexdigest())


def payload(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def wait_for(path, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + POLL_LIMIT
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"child exited ({proc.returncode}) before {path}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.002)


def spawn(tmp_path, tag: str, path, stage: str, entries: list[tuple[str, int, int]]) -> tuple[subprocess.Popen, str,
                                                                                             str]:
    reached, go = str(tmp_path / f"{tag}.reached"), str(tmp_path / f"{tag}.go")
    cfg = {"path": str(path), "src": SRC, "stage": stage, "reached": reached, "go": go, "entries": entries}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, reached, go


def seed_cache(path) -> None:
    s = PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.BUILD_IF_MISSING)
    s.put(k("old"), payload(0, 5000))
    assert s.flush() == 1
    s.close()


def read_all(path) -> dict[str, np.ndarray]:
    s = PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.READ_ONLY)
    try:
        assert s.invalid == {}
        return {e.lineage[0]: s.read_payload(e).copy() for e in s.entries().values()}
    finally:
        s.close()


STAGES = ["data_written", "locked", "data_published", "manifest_written", "manifest_replaced"]


@pytest.mark.parametrize("stage", STAGES)
def test_sigkill_mid_write_leaves_a_usable_cache(tmp_path, stage):
    folder = tmp_path / "cache"
    path = folder / "m.prepared.onnx"
    seed_cache(path)
    proc, reached, _ = spawn(tmp_path, "w", path, stage, [("new1", 1, 70_000), ("new2", 2, 3)])
    try:
        wait_for(reached, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    published = stage == "manifest_replaced"
    got = read_all(path)
    want = {"old": payload(0, 5000), **({"new1": payload(1, 70_000), "new2": payload(2, 3)} if published else {})}
    assert sorted(got) == sorted(want)
    for n, v in want.items():
        np.testing.assert_array_equal(got[n], v)
    assert verify(path) == []
    # the dead writer's lock is gone: the next build proceeds, and removes its leftovers
    s = PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.BUILD_IF_MISSING)
    s.put(k("after"), payload(9, 10))
    assert s.flush() == 1
    s.close()
    got = read_all(path)
    assert sorted(got) == sorted([*want, "after"])
    referenced = {os.path.basename(e.file) for e in PreparedModelStore(
        path, source_digest=SRC, policy=PreparedModelPolicy.READ_ONLY).entries().values()}
    assert set(os.listdir(folder)) == {"m.prepared.onnx", "m.prepared.lock", *referenced}
    assert verify(path) == []


@pytest.mark.parametrize("order", ["both_after_data", "one_holds_the_lock"])
def test_two_processes_building_at_once_both_contribute(tmp_path, order):
    folder = tmp_path / "cache"
    path = folder / "m.prepared.onnx"
    seed_cache(path)
    a_entries = [("a1", 11, 20_000), ("a2", 12, 100), ("shared", 99, 4097)]
    b_entries = [("b1", 21, 9000), ("shared", 99, 4097)]
    # B stops with its payloads written, before taking the exclusive lock.
    b, b_reached, b_go = spawn(tmp_path, "b", path, "data_written", b_entries)
    a = None
    try:
        wait_for(b_reached, b)
        # A stops either at the same point, or holding the exclusive lock with its manifest written.
        a_stage = "data_written" if order == "both_after_data" else "manifest_written"
        a, a_reached, a_go = spawn(tmp_path, "a", path, a_stage, a_entries)
        wait_for(a_reached, a)
        open(b_go, "w").close()  # B now contends for the lock A may hold
        open(a_go, "w").close()
        outs = [p.communicate(timeout=POLL_LIMIT) for p in (a, b)]
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert (a.returncode, b.returncode) == (0, 0), outs
    assert [o[0].strip() for o in outs] == ["3", "2"]
    got = read_all(path)
    assert sorted(got) == ["a1", "a2", "b1", "old", "shared"]
    for name, seed, n in [("old", 0, 5000), *a_entries, *b_entries]:
        np.testing.assert_array_equal(got[name], payload(seed, n))
    s = PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.READ_ONLY)
    assert s.generation == 3 and s.source_digest_of("a1") is not None and s.source_digest_of("b1") is not None
    referenced = {os.path.basename(e.file) for e in s.entries().values()}
    assert set(os.listdir(folder)) == {"m.prepared.onnx", "m.prepared.lock", *referenced}
    assert verify(path) == []
