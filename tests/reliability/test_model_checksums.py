"""Model checksums are verified on the first read of their bytes, with or without a companion (issue 14).

Semantics under test (docs/reliability.md, "Model checksums"): without persistence the hash runs in the
background while the run computes; a run, or a ``prepare()``, that may have used bytes failing their
checksum raises ``ExternalDataError`` instead of returning, and so does every later one. Bytes that a
writable companion would persist are verified before they are published.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import onnx
import pytest

from onnx_prepared.errors import ExternalDataError
from onnx_prepared.model import reader as reader_mod
from onnx_prepared.model import verified
from onnx_prepared.model.verify import ChecksumVerifier
from onnx_prepared.prepared.cache import PreparedModelStore, source_model_digest
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime.frame import ExecutionFrame
from tests.helpers.models import add_checksums, gemm_mlp, reference_mlp

X = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)


@pytest.fixture(autouse=True)
def _own_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))  # verification records land here
    monkeypatch.setattr(verified, "RACY_S", 0.0)  # the files here are seconds old: record them anyway


def _model(tmp_path, *, corrupt: str | None = None):
    path = gemm_mlp(tmp_path, layers=3, seed=1)
    add_checksums(path)
    if corrupt is not None:  # same size, checksums left as they were: the recorded sha256 no longer matches
        m = onnx.load(path, load_external_data=False)
        info = next({e.key: e.value for e in t.external_data} for t in m.graph.initializer if t.name == corrupt)
        with open(os.path.join(os.path.dirname(path), info["location"]), "r+b") as f:
            f.seek(int(info.get("offset", 0)))
            f.write(np.full(int(info["length"]) // 4, 0.5, np.float32).tobytes())
    return path


def _count_hashes(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = reader_mod.sha256_chunked

    def counting(buf, stop=None):
        calls.append(buf.size)
        return real(buf, stop)

    monkeypatch.setattr(reader_mod, "sha256_chunked", counting)
    return calls


def test_mismatch_without_a_companion_fails_every_run(tmp_path):
    path = _model(tmp_path, corrupt="W1")
    with RuntimeSession(path) as s:  # prepared_model_policy disabled (the default)
        for _ in range(2):  # level-triggered: the second run fails too, its objects came from those bytes
            with pytest.raises(ExternalDataError, match="checksum mismatch") as ei:
                s.run({"x": X})
            assert ei.value.tensor == "W1"
        with pytest.raises(ExternalDataError, match="checksum mismatch"):
            s.prepare()


def test_mismatch_is_caught_by_prepare(tmp_path):
    with RuntimeSession(_model(tmp_path, corrupt="W0")) as s, pytest.raises(ExternalDataError, match="W0"):
        s.prepare()


def test_matching_checksums_are_hashed_once_per_tensor(tmp_path, monkeypatch):
    calls = _count_hashes(monkeypatch)
    path = _model(tmp_path)
    with RuntimeSession(path) as s:
        (y,) = s.run({"x": X})
        s.prepare()
        (y2,) = s.run({"x": X})
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y, y2)
    n_external = sum(t.data_location == onnx.TensorProto.EXTERNAL
                     for t in onnx.load(path, load_external_data=False).graph.initializer)
    assert len(calls) == n_external  # every external tensor once, none twice


def test_the_run_computes_while_the_hash_runs_and_waits_for_it_before_returning(tmp_path, monkeypatch):
    """Overlap shown with gates: every node has run while each verification is still held back."""
    path = _model(tmp_path)
    gate, computed = threading.Event(), threading.Event()
    real = reader_mod.sha256_chunked

    def held(buf, stop=None):
        assert gate.wait(30), "the test never opened the gate"
        return real(buf, stop)

    monkeypatch.setattr(reader_mod, "sha256_chunked", held)
    real_step = ExecutionFrame.step

    def step(frame, execution):
        real_step(frame, execution)
        if frame.pc == len(execution.actions):  # the last action ran
            computed.set()

    monkeypatch.setattr(ExecutionFrame, "step", step)
    with RuntimeSession(path) as s:
        h = s.run_async({"x": X})
        assert computed.wait(30)  # the last node ran: no read waited for its hash
        assert not h.done()  # ... and the run does not complete before the hashes it depends on
        gate.set()
        (y,) = h.result(timeout=30)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_a_writable_companion_verifies_before_publishing(tmp_path):
    path = _model(tmp_path, corrupt="W2")
    companion = tmp_path / "c" / "m.prepared.onnx"
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(companion)}
    with RuntimeSession(path, opts) as s:
        assert not s.state.reader.reader.defer_verify or s.state.reader.reader.hash_reads
        with pytest.raises(ExternalDataError, match="W2"):
            s.run({"x": X})
    if companion.exists():
        store = PreparedModelStore(companion, source_digest=source_model_digest(path), policy="read_only")
        assert not [n for n in store.entries() if "W2" in n]  # nothing derived from the bad bytes persisted
        assert "W2" not in store.source_digests


def test_a_later_process_trusts_what_was_verified_only_under_the_same_fingerprint(tmp_path, monkeypatch):
    calls = _count_hashes(monkeypatch)
    path = _model(tmp_path)
    n = sum(t.data_location == onnx.TensorProto.EXTERNAL
            for t in onnx.load(path, load_external_data=False).graph.initializer)
    for expect in (n, 0):  # the second session trusts the first one's record: no hash at all
        calls.clear()
        with RuntimeSession(path) as s:
            np.testing.assert_allclose(s.run({"x": X})[0], reference_mlp(path, X), rtol=1e-5, atol=1e-6)
        assert len(calls) == expect
    data = os.path.join(os.path.dirname(path), onnx.load(path, load_external_data=False).graph.initializer[0]
                        .external_data[0].value)
    st = os.stat(data)
    with open(data, "r+b") as f:  # corrupt one byte of W1, restore the mtime: only ctime tells
        m = onnx.load(path, load_external_data=False)
        info = next({e.key: e.value for e in t.external_data} for t in m.graph.initializer if t.name == "W1")
        f.seek(int(info.get("offset", 0)) + 3)
        f.write(b"\x7f")
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    calls.clear()
    with RuntimeSession(path) as s, pytest.raises(ExternalDataError, match="checksum mismatch"):
        s.run({"x": X})
    assert len(calls) >= 1  # the record was not trusted: the bytes were hashed again


def test_a_file_changed_within_the_racy_window_is_not_recorded(tmp_path, monkeypatch):
    """Timestamps are coarse: a file rewritten in place within one tick of its hash could keep its
    fingerprint, so a file changed less than ``RACY_S`` ago gets no record and the next process hashes
    it again."""
    monkeypatch.setattr(verified, "RACY_S", 3600.0)
    calls = _count_hashes(monkeypatch)
    path = _model(tmp_path)
    n = sum(t.data_location == onnx.TensorProto.EXTERNAL
            for t in onnx.load(path, load_external_data=False).graph.initializer)
    for _ in range(2):
        calls.clear()
        with RuntimeSession(path) as s:
            s.run({"x": X})
        assert len(calls) == n  # hashed both times: nothing was recorded
    assert not os.path.isdir(verified.default_dir()) or not os.listdir(verified.default_dir())


def test_verifier_bounds_its_backlog_and_keeps_the_first_failure():
    v = ChecksumVerifier(max_pending_bytes=100)
    gate = threading.Event()
    assert v.submit(lambda: (gate.wait(30), None)[1], 80)
    assert not v.submit(lambda: None, 30)  # over the bound: the caller verifies inline
    assert v.submit(lambda: ExternalDataError("first", tensor="A"), 20)
    gate.set()
    for _ in range(2):
        with pytest.raises(ExternalDataError, match="first") as ei:
            v.check()
        assert ei.value.tensor == "A"
    v.fail(ExternalDataError("second"))
    with pytest.raises(ExternalDataError, match="first"):
        v.check()
    v.close()
    assert not v.submit(lambda: None, 1)
