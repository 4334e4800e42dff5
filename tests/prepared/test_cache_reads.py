"""The hit's read path: which byte ranges a companion read touches, in how many reads, and how often it hashes."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from onnx_prepared.errors import CacheError
from onnx_prepared.prepared import cache_io, payload_hash
from onnx_prepared.prepared.cache import PreparedModelPolicy, PreparedModelStore
from onnx_prepared.prepared.cache_format import ID_SIZE
from onnx_prepared.resolve.keys import PreparedKey

SRC = hashlib.sha256(b"source model").hexdigest()
RO = PreparedModelPolicy.READ_ONLY


def key(name: str) -> PreparedKey:
    return PreparedKey((name,), "gemm_b:t1", "cpu", hashlib.sha256(name.encode()).hexdigest())


def payload(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def build(path, items: dict[PreparedKey, np.ndarray]) -> None:
    with PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.BUILD_IF_MISSING) as s:
        for k, v in items.items():
            s.put(k, v)
        assert s.flush() == len(items)


@pytest.fixture
def spy(monkeypatch):
    """Records every mapping ((offset, length)), every copying read and every hasher made."""
    calls = {"map": [], "pread": 0, "hashers": 0}
    real_map, real_pread, real_hasher = cache_io.map_payload, cache_io.pread_into, payload_hash.hasher

    def map_payload(fd, offset, length):
        calls["map"].append((offset, length))
        return real_map(fd, offset, length)

    def pread_into(*a, **kw):
        calls["pread"] += 1
        return real_pread(*a, **kw)

    def hasher():
        calls["hashers"] += 1
        return real_hasher()

    monkeypatch.setattr(cache_io, "map_payload", map_payload)
    monkeypatch.setattr(cache_io, "pread_into", pread_into)
    monkeypatch.setattr(payload_hash, "hasher", hasher)
    return calls


def test_a_hit_maps_each_payload_and_its_identity_record_once_and_copies_nothing(tmp_path, spy):
    path = tmp_path / "m.prepared.onnx"
    items = {key("A"): payload(1, 9000), key("B"): payload(2, 1), key("C"): payload(3, 70_000)}
    build(path, items)
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        assert r.mapping
        entries = {k: r.lookup(k) for k in items}
        for k, want in items.items():
            got = r.read_payload(entries[k])
            np.testing.assert_array_equal(got, want)
            assert not got.flags.writeable  # a view of the file: prepared objects are immutable
        assert sorted(spy["map"]) == sorted((e.offset, e.length + ID_SIZE) for e in entries.values())
        assert spy["pread"] == 0 and r.bytes_read == sum(v.size for v in items.values())


def test_a_payload_is_hashed_once_per_entry_in_a_store(tmp_path, spy):
    """An evicted object restored again reads its bytes again but does not hash them again."""
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000), key("B"): payload(2, 5000)})
    spy["hashers"] = 0  # the writer's
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        for _ in range(3):
            for k in (key("A"), key("B")):
                r.read_payload(r.lookup(k))
        assert spy["hashers"] == 2 and len(spy["map"]) == 6


@pytest.fixture
def aged(monkeypatch):
    """The process memo remembers files changed at least ``RACY_S`` ago; 0 here, so a file built by the
    test counts as settled (no sleep). The memo starts empty and is emptied afterwards."""
    monkeypatch.setattr(payload_hash, "RACY_S", 0.0)
    payload_hash.forget_verified()
    yield
    payload_hash.forget_verified()


@pytest.mark.parametrize("mmap_env", ["1", "0"])
def test_a_second_session_in_the_process_hashes_nothing(tmp_path, spy, aged, monkeypatch, mmap_env):
    """Issue 12: verification once per entry per process, not per store."""
    monkeypatch.setenv(cache_io.MAP_ENV, mmap_env)
    path = tmp_path / "m.prepared.onnx"
    items = {key("A"): payload(1, 9000), key("B"): payload(2, 5000)}
    build(path, items)
    for want_hashers in (2, 0):
        spy["hashers"] = 0
        with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
            for k, v in items.items():
                np.testing.assert_array_equal(r.read_payload(r.lookup(k)), v)
        assert spy["hashers"] == want_hashers


def test_a_rewritten_companion_is_verified_again_and_a_corrupt_one_misses(tmp_path, spy, aged):
    """A new generation (new data file) is hashed again; a payload flipped in place (same size, new
    ctime) too, and it is a CacheError, then a miss naming the checksum."""
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000)})
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        r.read_payload(r.lookup(key("A")))
    build(path, {key("B"): payload(2, 5000)})  # merges A into a new index; B in a new data file
    spy["hashers"] = 0
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        a, b = r.lookup(key("A")), r.lookup(key("B"))
        r.read_payload(a)
        r.read_payload(b)
    assert spy["hashers"] == 1  # A (unchanged file) remembered, B's new file hashed
    with open(a.file, "r+b") as f:  # a bit flip in place: same size, same inode
        f.seek(a.offset + 17)
        byte = f.read(1)
        f.seek(a.offset + 17)
        f.write(bytes([byte[0] ^ 1]))
    spy["hashers"] = 0
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        with pytest.raises(CacheError, match="checksum mismatch"):
            r.read_payload(r.lookup(key("A")))
        assert spy["hashers"] == 1
        assert r.lookup(key("A")) is None and "checksum mismatch" in r.explain_miss(key("A"))


def test_a_file_changed_just_now_is_not_remembered(tmp_path, spy, monkeypatch):
    """Timestamps are coarse: a file changed within ``RACY_S`` could be rewritten in place under the same
    fingerprint, so a second session hashes it again."""
    monkeypatch.setattr(payload_hash, "RACY_S", 3600.0)
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000)})
    spy["hashers"] = 0
    for _ in range(2):
        with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
            r.read_payload(r.lookup(key("A")))
    assert spy["hashers"] == 2


def test_mapping_off_copies_into_fresh_buffers_with_one_read_per_entry(tmp_path, spy, monkeypatch):
    monkeypatch.setenv(cache_io.MAP_ENV, "0")
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000)})
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        assert not r.mapping
        got = r.read_payload(r.lookup(key("A")))
    np.testing.assert_array_equal(got, payload(1, 9000))
    assert got.flags.writeable and spy["map"] == [] and spy["pread"] == 1


def test_without_locks_payloads_are_copied_not_mapped(tmp_path, spy):
    """Lockless mode is for network filesystems, where another host may delete a mapped data file."""
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000)})
    with PreparedModelStore(path, source_digest=SRC, policy=RO, locking=False) as r:
        assert not r.mapping
        np.testing.assert_array_equal(r.read_payload(r.lookup(key("A"))), payload(1, 9000))
    assert spy["map"] == [] and spy["pread"] == 1


def test_a_file_that_cannot_be_mapped_is_copied(tmp_path, spy, monkeypatch):
    import errno

    def unmappable(fd, offset, length):
        raise OSError(errno.ENODEV, "no mmap here")

    monkeypatch.setattr(cache_io, "map_payload", unmappable)
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000)})
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        np.testing.assert_array_equal(r.read_payload(r.lookup(key("A"))), payload(1, 9000))
    assert spy["pread"] == 1


def test_a_mapped_read_of_another_entrys_bytes_is_corrupt_and_a_miss(tmp_path):
    """The identity record after the payload is checked on the mapping too: an index entry pointing at
    another entry's bytes (same length, its own checksum) is a CacheError, then a miss naming why."""
    import dataclasses

    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 9000), key("B"): payload(2, 9000)})
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        a, b = r.lookup(key("A")), r.lookup(key("B"))
        swapped = dataclasses.replace(a, offset=b.offset, checksum=b.checksum)
        r._entries = {**r._entries, a.key_name: swapped}
        with pytest.raises(CacheError, match="written for another"):
            r.read_payload(swapped)
        assert r.lookup(key("A")) is None and "swapped or mislabelled" in r.explain_miss(key("A"))


def test_the_source_model_digest_of_a_loaded_model_is_computed_once(tmp_path, monkeypatch):
    """A replica names its companion by the digest, then its session opens the companion by it: one
    serialization and sha256 of the model, not two. Another model object, or a changed one, is hashed."""
    import onnx

    from onnx_prepared.prepared import cache
    from tests.helpers.models import gemm_mlp

    (tmp_path / "m").mkdir()
    path = gemm_mlp(tmp_path / "m", layers=2)
    calls = []
    real = cache._model_digest
    monkeypatch.setattr(cache, "_model_digest", lambda m: calls.append(m) or real(m))
    model = onnx.load(path, load_external_data=False)
    d = cache.source_model_digest(path, model)
    assert cache.source_model_digest(path, model) == d and len(calls) == 1
    assert cache.source_model_digest(path) == d and len(calls) == 2  # parsed again: a new object
    model.graph.name = "changed"
    assert cache.source_model_digest(path, model) != d and len(calls) == 3


def test_a_complete_hit_under_build_if_missing_hashes_no_source_read(tmp_path, monkeypatch):
    """A model without recorded checksums: the building session hashes its source reads (their digests
    make the lineage the entries are found by); a later session that hits every entry reads only raw
    sources and has nothing to persist, so it hashes none of them."""
    from onnx_prepared.model import reader as reader_mod
    from onnx_prepared.runtime import RuntimeSession
    from tests.helpers.models import gemm_mlp, reference_mlp

    x = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)
    (tmp_path / "m").mkdir()
    path = gemm_mlp(tmp_path / "m", layers=3)
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "c" / "m.prepared.onnx")}
    calls: list[int] = []
    real = reader_mod.sha256_chunked
    monkeypatch.setattr(reader_mod, "sha256_chunked", lambda buf, stop=None: calls.append(buf.size) or real(buf, stop))
    with RuntimeSession(path, opts) as s:
        s.prepare()
    assert calls  # the build
    calls.clear()
    with RuntimeSession(path, opts) as s:
        (y,) = s.run({"x": x})
        s.prepare()
        counters = dict(s.state.counters)
    assert not any(k.startswith("prepack:") for k in counters) and any(k.startswith("read_packed:") for k in counters)
    assert calls == []
    np.testing.assert_allclose(y, reference_mlp(path, x), rtol=1e-5, atol=1e-6)
