"""Replicas as real processes on one empty shared cache: all correct, one valid companion, nobody waits.

Each replica (``tests.helpers.serving.replica_process``) waits at a barrier so all open their session
at once, serves one request and waits for its preparation and flush. Afterwards every answer must equal
a session without cache (and onnxruntime), ``cache verify`` must find nothing, and the companion must
hold every packed object. The same runs with locking off (``ONNX_PREPARED_CACHE_LOCKING=0``), the
network-filesystem path. Gates are multiprocessing events and barriers, never sleeps.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import warnings

import numpy as np
import pytest

from onnx_prepared.errors import CacheWarning
from onnx_prepared.prepared import cache_io
from onnx_prepared.prepared.cache import PreparedModelStore, collect_garbage, source_model_digest, verify
from onnx_prepared.serve.replica import ModelReplica, companion_path
from tests.helpers.serving import (
    GATE_LIMIT,
    direct_outputs,
    feeds,
    model_file,
    ort_outputs,
    prepack_counts,
    replica_process,
    small_llm,
)

REPLICAS = 3


def context():
    """Replica processes forked from a server that imported the replica once (their start stays cheap)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.helpers.serving", "onnx_prepared.serve.replica", "onnx_prepared.runtime"])
    return ctx


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = model_file(small_llm(tmp_path_factory.mktemp("shared-cache-llm"), tokenizer=False))
    return model, direct_outputs(model), ort_outputs(model)


def collect(results, procs, n):
    got = {}
    for _ in range(n):
        tag, r = results.get(timeout=GATE_LIMIT)
        assert "error" not in r, (tag, r["error"])
        got[tag] = r
    for p in procs:
        p.join(GATE_LIMIT)
        assert p.exitcode == 0
    return got


def check_cache(model, cache, n_objects):
    path = companion_path(model, cache)
    assert verify(path) == []
    store = PreparedModelStore(path, source_digest=source_model_digest(model), policy="read_only")
    try:
        assert store.invalid == {}
        assert len(store.entries()) == n_objects
        for e in store.entries().values():
            store.read_payload(e)  # checksum and identity record of every payload
    finally:
        store.close()


@pytest.mark.parametrize("locking", [True, False], ids=["flock", "no-locks"])
def test_replicas_starting_at_once_on_an_empty_cache(llm, tmp_path, locking):
    model, want, ort = llm
    cache = str(tmp_path / "shared")
    ctx = context()
    barrier, results = ctx.Barrier(REPLICAS), ctx.Queue()
    procs = [ctx.Process(target=replica_process, args=(model, cache, barrier, results, f"r{i}", locking))
             for i in range(REPLICAS)]
    for p in procs:
        p.start()
    got = collect(results, procs, REPLICAS)
    for r in got.values():
        assert r["locking"] is locking
        for n, v in want.items():
            np.testing.assert_array_equal(r["outputs"][n], v)
            np.testing.assert_allclose(r["outputs"][n], ort[n], atol=1e-4, rtol=1e-3)
    n_objects = max(r["prepacked"] + r["hits"] for r in got.values())
    assert all(r["prepacked"] + r["hits"] == n_objects for r in got.values())
    check_cache(model, cache, n_objects)
    # a replica started afterwards prepacks nothing
    replica = ModelReplica(model, cache)
    try:
        np.testing.assert_array_equal(asyncio.run(replica.infer(feeds()))["logits"], want["logits"])
        assert replica.wait_prepared(GATE_LIMIT)
        assert prepack_counts(replica.session) == (0, n_objects)
    finally:
        replica.close()


def test_a_replica_does_not_wait_for_another_replicas_build(llm, tmp_path):
    """Replica A stops with its payloads written, before publishing; B starts, builds, publishes, answers."""
    model, want, _ = llm
    cache = str(tmp_path / "shared")
    ctx = context()
    results, reached, go = ctx.Queue(), ctx.Event(), ctx.Event()
    a = ctx.Process(target=replica_process, args=(model, cache, None, results, "a", True, (reached, go)))
    a.start()
    try:
        assert reached.wait(GATE_LIMIT)
        b = ctx.Process(target=replica_process, args=(model, cache, None, results, "b", True))
        b.start()
        tag, rb = results.get(timeout=GATE_LIMIT)  # B finishes while A is still held at its gate
        assert tag == "b" and "error" not in rb, rb
        assert rb["hits"] == 0 and rb["prepacked"] > 0
        np.testing.assert_array_equal(rb["outputs"]["logits"], want["logits"])
    finally:
        go.set()
    ra = collect(results, [a, b], 1)["a"]
    np.testing.assert_array_equal(ra["outputs"]["logits"], want["logits"])
    check_cache(model, cache, rb["prepacked"])


def test_no_locks_cleanup_keeps_young_files_and_a_failing_flock_turns_locking_off(llm, tmp_path, monkeypatch):
    model, _, _ = llm
    folder = tmp_path / "c"
    folder.mkdir()
    path = str(folder / "m.prepared.onnx")
    young = folder / "m.prepared.0123456789abcdef.data"  # unreferenced, as a writer's before it publishes
    young.write_bytes(b"x" * 10)
    live_tmp = folder / ".m.prepared.00112233445566ff.data.tmp"
    live_tmp.write_bytes(b"y")
    assert collect_garbage(path, locking=False) == []
    old = os.stat(young).st_mtime - cache_io.LOCKLESS_GRACE_S - 1
    os.utime(young, (old, old))
    os.utime(live_tmp, (old, old))
    assert sorted(collect_garbage(path, locking=False)) == sorted([young.name, live_tmp.name])
    assert not (folder / "m.prepared.lock").exists()  # no lock file is ever made without locking

    import errno

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(cache_io.fcntl, "flock", no_flock)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        store = PreparedModelStore(path, source_digest=source_model_digest(model), policy="build_if_missing")
    assert store.locking is False
    assert [x.category for x in w] == [CacheWarning] and "does not support flock" in str(w[0].message)
    store.close()


def test_no_locks_a_writer_whose_index_was_replaced_meanwhile_merges_again(tmp_path, monkeypatch):
    """Without locks, A merged with the index, then B published before A's rename: A merges again."""
    import hashlib
    import threading

    from onnx_prepared.resolve.keys import PreparedKey

    src = hashlib.sha256(b"model").hexdigest()
    path = str(tmp_path / "m.prepared.onnx")
    reached, go = threading.Event(), threading.Event()

    def checkpoint(stage):
        if stage == "manifest_written" and threading.current_thread().name == "A" and not go.is_set():
            reached.set()
            assert go.wait(GATE_LIMIT)

    monkeypatch.setattr(cache_io, "checkpoint", checkpoint)

    def store(name, seed):
        s = PreparedModelStore(path, source_digest=src, policy="build_if_missing", locking=False)
        key = PreparedKey((name,), "L", "cpu", hashlib.sha256(name.encode()).hexdigest())
        s.put(key, np.random.default_rng(seed).integers(0, 256, 5000, dtype=np.uint8))
        return s

    a, b = store("a", 1), store("b", 2)
    errors = []
    t = threading.Thread(target=lambda: errors.append(a.flush()), name="A")
    t.start()
    assert reached.wait(GATE_LIMIT)  # A has written its merged index, not renamed it yet
    assert b.flush() == 1             # B publishes meanwhile
    go.set()
    t.join(GATE_LIMIT)
    assert errors == [1]
    a.close()
    b.close()
    assert verify(path) == []
    got = PreparedModelStore(path, source_digest=src, policy="read_only", locking=False)
    assert sorted(e.lineage[0] for e in got.entries().values()) == ["a", "b"]  # B's entry survived A's publish
    got.close()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".onnx.tmp")]  # A's dropped index is gone
