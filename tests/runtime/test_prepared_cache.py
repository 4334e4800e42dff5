"""The companion prepared model through the session: hits read no source bytes and never prepack."""

import os

import numpy as np
import pytest

from onnx_prepared import InferenceSession, SessionOptions
from onnx_prepared.plan.prepared_plan import PlanError
from onnx_prepared.prepared.cache import PreparedModelStore, source_model_digest, verify
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import add_checksums, gemm_mlp, reference_mlp, rewrite_tensor

X = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)


def _model(tmp_path, checksums=True):
    (tmp_path / "m").mkdir()
    path = gemm_mlp(tmp_path / "m", layers=3)
    if checksums:
        add_checksums(path)
    return path


def _opts(policy, companion):
    return {"prepared_model_policy": policy, "prepared_model_path": str(companion)}


def _build(path, companion):
    with RuntimeSession(path, _opts("build_if_missing", companion)) as s:
        s.prepare()
        return dict(s.state.counters)


def _files(folder):
    return {p: os.stat(os.path.join(folder, p)).st_mtime_ns for p in sorted(os.listdir(folder))}


def test_hit_reads_no_source_bytes_and_never_prepacks(tmp_path, gated_reader):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    built = _build(path, companion)
    assert sum(1 for k in built if k.startswith("prepack:")) == 3
    assert verify(companion) == []
    reader = gated_reader()
    with RuntimeSession(path, _opts("read_only", companion), reader=reader) as s:
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)
        assert set(s.resolved.manifest.dormant) == {"W0", "W1", "W2"}
        (y,) = s.run({"x": X})
        counters = dict(s.state.counters)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert not any(k.startswith("prepack:") for k in counters)
    assert sum(1 for k in counters if k.startswith("read_packed:")) == 3
    assert {n for ev, n in reader.log} == {"c0", "c1", "c2"}  # only the raw biases: no W* source byte


def test_rewritten_data_file_is_reverified_and_only_the_changed_entry_is_replaced(tmp_path):
    """Digests are trusted only under the data file's stat fingerprint: after an in-place rewrite of W1
    every entry backed by that file misses once (its sources are read, verified and re-recorded), W0 and
    W2 keep their entries (same lineage digest), W1 gets a new one."""
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    _build(path, companion)
    with PreparedModelStore(companion, source_digest=source_model_digest(path), policy="read_only") as st:
        before = st.entries()
    rewrite_tensor(path, "W1", np.full((16, 16), 0.5, np.float32))
    with RuntimeSession(path, _opts("build_if_missing", companion)) as s:
        cached = {r.key.lineage[0]: r.cached for r in s.resolved.requirements if not r.key.is_raw}
        assert cached == {"W0": False, "W1": False, "W2": False}
        (y,) = s.run({"x": X})
    with PreparedModelStore(companion, source_digest=source_model_digest(path), policy="read_only") as st:
        after = st.entries()
    changed = {n for n in after if after[n] != before.get(n)}
    assert len(changed) == 1 and "W1" in changed.pop()
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    with RuntimeSession(path, _opts("require_complete", companion)) as s:  # the miss was persisted
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)


def test_require_complete_fails_before_inference_naming_missing_entries(tmp_path):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    with pytest.raises(PlanError, match=r"require_complete.*3 prepared object.*W0@gemm"):
        RuntimeSession(path, _opts("require_complete", companion))


def test_read_only_never_creates_or_modifies_a_file(tmp_path):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    with RuntimeSession(path, _opts("read_only", companion)) as s:
        s.run({"x": X})
    assert not (tmp_path / "c").exists()
    _build(path, companion)
    before = _files(tmp_path / "c")
    with RuntimeSession(path, _opts("read_only", companion)) as s:
        s.prepare()
        s.run({"x": X})
    assert _files(tmp_path / "c") == before


def test_corrupt_payload_falls_back_to_the_source(tmp_path):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    _build(path, companion)
    data = [p for p in os.listdir(tmp_path / "c") if p.endswith(".data")]
    with open(tmp_path / "c" / data[0], "r+b") as f:  # flip one byte of the first payload
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    with RuntimeSession(path, _opts("read_only", companion)) as s:
        (y,) = s.run({"x": X})
        assert any(k.startswith("cache_corrupt:") for k in s.state.counters)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert verify(companion)  # the corruption is reported


def test_without_checksums_a_sidecar_digest_enables_the_next_hit(tmp_path):
    path, companion = _model(tmp_path, checksums=False), tmp_path / "c" / "m.prepared.onnx"
    with RuntimeSession(path, _opts("build_if_missing", companion)) as s:
        assert all(r.key.lineage_digest is None for r in s.resolved.requirements)  # unverified: source recipe
        s.prepare()
    with RuntimeSession(path, _opts("read_only", companion)) as s:
        assert all(r.cached for r in s.resolved.requirements if not r.key.is_raw)
        np.testing.assert_allclose(s.run({"x": X})[0], reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_inference_session_accepts_the_policy(tmp_path):
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    so = SessionOptions()
    so.prepared_model_policy = "build_if_missing"
    so.prepared_model_path = str(companion)
    sess = InferenceSession(path, so)
    sess.run(None, {"x": X})
    sess.close()
    assert verify(companion) == [] and len(os.listdir(tmp_path / "c")) >= 2


def test_close_releases_the_companion_store_it_opened(tmp_path):
    """close() releases everything the session opened: the payload files of its companion store too."""
    path, companion = _model(tmp_path), tmp_path / "c" / "m.prepared.onnx"
    _build(path, companion)
    s = RuntimeSession(path, _opts("read_only", companion))
    s.prepare()  # reads packed payloads: the store holds the data file open
    store = s.companion
    assert store._fds
    s.close()
    assert store._closed and not store._fds
    s.close()  # idempotent
