"""Faults injected into cache writes and reads (patched writer/reader), and two writers racing a reader.

Allowed outcomes: a correct result, or an onnx_prepared error; never a stale hit, a raw OSError or a
half-published companion.
"""

from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from onnx_prepared.errors import CacheError
from onnx_prepared.prepared import cache_io
from onnx_prepared.prepared.cache import PreparedModelStore, verify
from onnx_prepared.resolve.keys import PreparedKey
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import add_checksums, gemm_mlp, reference_mlp

X = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
SRC = "a" * 64


def _model(tmp_path):
    (tmp_path / "m").mkdir()
    path = gemm_mlp(tmp_path / "m", layers=3)
    add_checksums(path)
    return path


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_write_faults_are_cache_errors_and_leave_the_previous_generation(tmp_path, monkeypatch, code):
    path = tmp_path / "m.prepared.onnx"
    s = PreparedModelStore(path, source_digest=SRC, policy="build_if_missing")
    s.put(PreparedKey(("A",), "l", "cpu", "1" * 64), np.ones(10, np.uint8))
    s.flush()
    s.put(PreparedKey(("B",), "l", "cpu", "2" * 64), np.ones(10, np.uint8))
    real = os.pwrite

    def failing(fd, data, offset):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(cache_io.os, "pwrite", failing)
    with pytest.raises(CacheError, match=os.strerror(code)):
        s.flush()
    monkeypatch.setattr(cache_io.os, "pwrite", real)
    assert verify(path) == [] and s.pending == 1
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert s.flush() == 1 and verify(path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_session_survives_cache_write_faults(tmp_path, monkeypatch, code):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"

    def failing(fd, data, offset):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(cache_io.os, "pwrite", failing)
    with RuntimeSession(path, {"prepared_model_policy": "build_if_missing",
                               "prepared_model_path": str(companion)}) as s:
        (y,) = s.run({"x": X})
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_read_faults_rebuild_from_the_source(tmp_path, monkeypatch, code):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    opts = {"prepared_model_policy": "read_only", "prepared_model_path": str(companion)}
    with RuntimeSession(path, {**opts, "prepared_model_policy": "build_if_missing"}) as s:
        s.prepare()

    def failing(fd, buf, offset, record=None, *, hasher=None):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(cache_io, "pread_into", failing)
    monkeypatch.setattr(cache_io, "map_payload", lambda fd, offset, length: failing(fd, None, offset))
    with RuntimeSession(path, opts) as s:
        (y,) = s.run({"x": X})
        assert sum(k.startswith("cache_corrupt:") for k in s.state.counters) == 3
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_two_writers_racing_a_reader(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(w):
        try:
            for i in range(15):
                s = PreparedModelStore(path, source_digest=SRC, policy="build_if_missing")
                s.put(PreparedKey((f"W{w}_{i}",), "l", "cpu", f"{w * 100 + i:064x}"), np.full(5000, i, np.uint8))
                s.flush()
                s.close()
        except BaseException as e:
            errors.append(e)

    def reader():
        try:
            while not stop.is_set():
                with PreparedModelStore(path, source_digest=SRC, policy="read_only") as r:
                    for e in r.entries().values():
                        i = int(e.lineage[0].split("_")[1])
                        assert (r.read_payload(e) == i).all()
        except BaseException as e:
            errors.append(e)

    ws = [threading.Thread(target=writer, args=(w,)) for w in (1, 2)]
    rd = threading.Thread(target=reader)
    rd.start()
    for t in ws:
        t.start()
    for t in ws:
        t.join(120)
    stop.set()
    rd.join(120)
    assert not errors, errors[:3]
    with PreparedModelStore(path, source_digest=SRC, policy="read_only") as r:
        assert len(r.entries()) == 30
    assert verify(path) == []
