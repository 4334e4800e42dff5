"""The prepared cache never serves stale or mislabelled weights (issue 14, classes a-c).

(a) a data file rewritten in place (same size, even with its mtime restored) after the companion was
built: every entry it backs misses (re-verified by rebuilding), never a stale hit; model checksums that
no longer match are an ExternalDataError; (b) byte-identical .onnx files in two folders with different
data files get different default companions; (c) entries whose external data were swapped are caught by
the payload identity record on read (rebuilt from the source) and by ``cache verify``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_prepared.errors import ExternalDataError
from onnx_prepared.prepared.cache import PreparedModelStore, default_prepared_path, source_model_digest, verify
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import add_checksums, gemm_mlp, reference_mlp

X = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)


def _model(folder, checksums, seed=0):
    os.makedirs(folder, exist_ok=True)
    path = gemm_mlp(folder, layers=3, seed=seed)
    if checksums:
        add_checksums(path)
    return path


def _opts(policy, companion=None):
    o = {"prepared_model_policy": policy}
    if companion is not None:
        o["prepared_model_path"] = str(companion)
    return o


def _run(path, policy, companion=None):
    with RuntimeSession(path, _opts(policy, companion)) as s:
        (y,) = s.run({"x": X})
        s.prepare()
        return y, dict(s.state.counters)


def _rewrite_in_place(path, keep_mtime):
    """Overwrite every W* tensor's bytes (same size) without touching the model or its checksums."""
    m = onnx.load(path, load_external_data=False)
    data = os.path.join(os.path.dirname(path), m.graph.initializer[0].external_data[0].value)
    st = os.stat(data)
    with open(data, "r+b") as f:
        for t in m.graph.initializer:
            if t.name.startswith("W"):
                info = {e.key: e.value for e in t.external_data}
                f.seek(int(info.get("offset", 0)))
                f.write(np.full(int(info["length"]) // 4, 0.25, np.float32).tobytes())
    if keep_mtime:
        os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(data).st_size == st.st_size


@pytest.mark.parametrize("policy", ["read_only", "build_if_missing"])
@pytest.mark.parametrize("keep_mtime", [False, True])
def test_data_rewritten_in_place_is_never_a_stale_hit(tmp_path, policy, keep_mtime):
    path = _model(tmp_path / "m", checksums=False)
    companion = tmp_path / "c" / "m.prepared.onnx"
    _run(path, "build_if_missing", companion)
    _, hot = _run(path, "read_only", companion)
    assert sum(k.startswith("read_packed:") for k in hot) == 3  # the companion works before the rewrite
    _rewrite_in_place(path, keep_mtime)
    y, counters = _run(path, policy, companion)
    assert not any(k.startswith("read_packed:") for k in counters), counters
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    if policy == "build_if_missing":  # the new bytes were recorded under the new fingerprint: hits again
        y2, again = _run(path, "read_only", companion)
        assert sum(k.startswith("read_packed:") for k in again) == 3
        np.testing.assert_allclose(y2, y, rtol=0, atol=0)


@pytest.mark.parametrize("policy", ["read_only", "build_if_missing"])
def test_rewrite_under_stale_model_checksums_is_an_external_data_error(tmp_path, policy):
    path = _model(tmp_path / "m", checksums=True)
    companion = tmp_path / "c" / "m.prepared.onnx"
    _run(path, "build_if_missing", companion)
    _rewrite_in_place(path, keep_mtime=True)
    with pytest.raises(ExternalDataError, match="checksum mismatch"):
        _run(path, policy, companion)


def test_rewrite_with_refreshed_checksums_rebuilds(tmp_path):
    path = _model(tmp_path / "m", checksums=True)
    companion = tmp_path / "c" / "m.prepared.onnx"
    _run(path, "build_if_missing", companion)
    _rewrite_in_place(path, keep_mtime=False)
    add_checksums(path)
    y, counters = _run(path, "read_only", companion)
    assert not any(k.startswith("read_packed:") for k in counters)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_copied_model_misses_instead_of_trusting_another_files_digests(tmp_path):
    path = _model(tmp_path / "m", checksums=True)
    companion = tmp_path / "c" / "m.prepared.onnx"
    _run(path, "build_if_missing", companion)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "m", copy)
    y, counters = _run(str(copy / "model.onnx"), "read_only", companion)
    assert not any(k.startswith("read_packed:") for k in counters)  # other inode: re-verify, never trust
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("checksums", [False, True])
def test_identical_onnx_with_different_data_files_at_the_default_path(tmp_path, monkeypatch, checksums):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    a = _model(tmp_path / "a", checksums=False, seed=0)
    b = _model(tmp_path / "b", checksums=False, seed=1)  # same graph, other weights
    if checksums:  # checksums are stripped from the identity: the digests agree either way
        add_checksums(a)
        add_checksums(b)
    else:
        shutil.copy(a, b)  # byte-identical .onnx files
        assert Path(a).read_bytes() == Path(b).read_bytes()
    assert source_model_digest(a) == source_model_digest(b)
    assert default_prepared_path(a) != default_prepared_path(b)
    for p in (a, b):
        _run(p, "build_if_missing")
    for p in (a, b):
        y, counters = _run(p, "read_only")
        assert sum(k.startswith("read_packed:") for k in counters) == 3
        np.testing.assert_allclose(y, reference_mlp(p, X), rtol=1e-5, atol=1e-6)


def _swap_external_data(companion, n1, n2):
    m = onnx.load(str(companion), load_external_data=False)
    t = {t.name: t for t in m.graph.initializer}
    e1, e2 = list(t[n1].external_data), list(t[n2].external_data)
    for dst, src in ((t[n1], e2), (t[n2], e1)):
        del dst.external_data[:]
        dst.external_data.extend(src)
    onnx.save(m, str(companion))


def test_swapped_entries_are_caught_on_read_and_by_verify(tmp_path):
    path = _model(tmp_path / "m", checksums=True)
    companion = tmp_path / "c" / "m.prepared.onnx"
    _run(path, "build_if_missing", companion)
    assert verify(companion) == []
    names = sorted(n for n in PreparedModelStore(companion, source_digest=source_model_digest(path),
                                                 policy="read_only").entries() if "W" in n)
    assert len(names) == 3
    _swap_external_data(companion, names[0], names[2])
    problems = verify(companion)
    assert len(problems) == 2 and all("another" in p for p in problems), problems
    y, counters = _run(path, "read_only", companion)
    assert sum(k.startswith("cache_corrupt:") for k in counters) == 2  # caught, rebuilt from the source
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
