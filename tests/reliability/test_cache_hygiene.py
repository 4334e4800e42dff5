"""Cache hygiene: gc and cleanup at flush, a corrupt entry re-published in the same session, a read-only
cache folder degrading to read-only with one warning."""

from __future__ import annotations

import fcntl
import os
import warnings

import numpy as np
import onnx
import pytest

from onnx_prepared import cli
from onnx_prepared.errors import CacheWarning
from onnx_prepared.prepared import cache_io
from onnx_prepared.prepared.cache import PreparedModelStore, collect_garbage, verify
from onnx_prepared.resolve.keys import PreparedKey
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import add_checksums, gemm_mlp, reference_mlp

X = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
SRC = "a" * 64


def _store(path, n=1, seed=0):
    s = PreparedModelStore(path, source_digest=SRC, policy="build_if_missing")
    for i in range(n):
        s.put(PreparedKey((f"W{seed}_{i}",), "gemm-b-kn", "cpu", f"{seed + i:064x}"), np.full(100, i, np.uint8))
    s.flush()
    return s


def _orphans(folder):
    """A dead writer's temporary data and manifest files and a superseded generation."""
    for name in (".m.prepared.0123456789abcdef.data.tmp", ".m.prepared.fedcba9876543210.onnx.tmp",
                 "m.prepared.00000000deadbeef.data"):
        (folder / name).write_bytes(b"junk")
    return {".m.prepared.0123456789abcdef.data.tmp", ".m.prepared.fedcba9876543210.onnx.tmp",
            "m.prepared.00000000deadbeef.data"}


def test_gc_removes_superseded_generations_and_dead_writers_files_only(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    _store(path).close()
    live = tmp_path / ".m.prepared.1111111111111111.data.tmp"  # a live writer holds its flock
    fd = os.open(live, os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    other = tmp_path / "other.prepared.2222222222222222.data"  # another cache's file: never touched
    other.write_bytes(b"x")
    orphans = _orphans(tmp_path)
    try:
        assert set(collect_garbage(path)) == orphans
        assert live.exists() and other.exists() and verify(path) == []
    finally:
        os.close(fd)
    assert collect_garbage(path) == [live.name]  # its writer died: now an orphan
    assert collect_garbage(path) == []


def test_gc_cli(tmp_path, capsys):
    path = tmp_path / "m.prepared.onnx"
    _store(path).close()
    orphans = _orphans(tmp_path)
    assert cli.main(["cache", "gc", str(path)]) == 0
    out = capsys.readouterr().out
    assert all(o in out for o in orphans) and "3 file(s) removed" in out
    assert verify(path) == []


def test_gc_refuses_a_corrupt_manifest(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    _store(path).close()
    m = onnx.load(str(path), load_external_data=False)
    m.graph.initializer[0].external_data[0].value = "../escape.data"
    onnx.save(m, str(path))
    assert cli.main(["cache", "gc", str(path)]) == 1


def test_flush_cleans_up_what_crashed_writers_left(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    _store(path).close()
    orphans = _orphans(tmp_path)
    _store(path, seed=7).close()  # the next publication
    assert not orphans & set(os.listdir(tmp_path)) and verify(path) == []


def _model(tmp_path):
    (tmp_path / "m").mkdir()
    path = gemm_mlp(tmp_path / "m", layers=3)
    add_checksums(path)
    return path


def _flip_first_payload_byte(companion):
    m = onnx.load(str(companion), load_external_data=False)
    t = next(t for t in m.graph.initializer if "W1" in t.name)
    info = {e.key: e.value for e in t.external_data}
    with open(companion.parent / info["location"], "r+b") as f:
        f.seek(int(info["offset"]))
        b = f.read(1)
        f.seek(int(info["offset"]))
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_entry_is_rebuilt_and_republished_in_the_same_session(tmp_path):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(companion)}
    with RuntimeSession(path, opts) as s:
        s.prepare()
    _flip_first_payload_byte(companion)
    assert verify(companion)
    with RuntimeSession(path, opts) as s:
        (y,) = s.run({"x": X})
        s.prepare()
        assert sum(k.startswith("cache_corrupt:") for k in s.state.counters) == 1
        assert sum(k.startswith("cache_republished:") for k in s.state.counters) == 1
        assert verify(companion) == []  # re-published before this session ends
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    with RuntimeSession(path, {**opts, "prepared_model_policy": "require_complete"}) as s:
        (y2,) = s.run({"x": X})
        assert not any(k.startswith(("cache_corrupt:", "prepack:")) for k in s.state.counters)
    np.testing.assert_array_equal(y, y2)


def _read_only_folder(monkeypatch):
    def refuse(path, *, create):
        if create:
            raise PermissionError(13, "Permission denied", path)
        return None

    monkeypatch.setattr(cache_io, "open_lock", refuse)


def test_read_only_cache_folder_degrades_with_one_warning(tmp_path, monkeypatch):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    _read_only_folder(monkeypatch)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with RuntimeSession(path, {"prepared_model_policy": "build_if_missing",
                                   "prepared_model_path": str(companion)}) as s:
            (y,) = s.run({"x": X})
            s.prepare()  # must not raise PermissionError
            s.prepare()
            assert s.companion.degraded and s.companion.policy.value == "read_only"
    caught = [x for x in w if issubclass(x.category, CacheWarning)]
    assert len(caught) == 1 and "read-only" in str(caught[0].message)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert not companion.exists()


def test_cache_build_in_a_read_only_folder_is_our_error(tmp_path, monkeypatch, capsys):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    _read_only_folder(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert cli.main(["cache", "build", path, "--out", str(companion), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "not writable" in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_really_read_only_folder(tmp_path):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    companion.parent.mkdir()
    os.chmod(companion.parent, 0o555)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            with RuntimeSession(path, {"prepared_model_policy": "build_if_missing",
                                       "prepared_model_path": str(companion)}) as s:
                s.prepare()
    finally:
        os.chmod(companion.parent, 0o755)

