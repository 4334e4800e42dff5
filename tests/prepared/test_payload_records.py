"""Payload checksums verified across processes: a data file's verification record (model/verified.py)
lets a later cold start of the same companion skip the XXH3 pass, while a file changed since is hashed
again before any of its bytes are used."""

from __future__ import annotations

import hashlib
import marshal
import os

import numpy as np
import pytest

from onnx_prepared.errors import CacheError
from onnx_prepared.model import verified
from onnx_prepared.prepared import payload_hash
from onnx_prepared.prepared.cache import PreparedModelPolicy, PreparedModelStore
from onnx_prepared.resolve.keys import PreparedKey

SRC = hashlib.sha256(b"source model").hexdigest()
RO = PreparedModelPolicy.READ_ONLY


def key(name: str) -> PreparedKey:
    return PreparedKey((name,), "gemm_b:t1", "cpu", hashlib.sha256(name.encode()).hexdigest())


ITEMS = {key("A"): np.arange(9000, dtype=np.uint8), key("B"): np.arange(5000, dtype=np.uint8)[::-1].copy()}


@pytest.fixture
def hashers(monkeypatch, tmp_path):
    """Counts hashers made; files built by the test count as settled (RACY_S 0); the process memo and
    the records read are emptied before and after (each ``forget_verified`` stands for a new process)."""
    n = {"made": 0}
    real = payload_hash.hasher

    def hasher():
        n["made"] += 1
        return real()

    monkeypatch.setattr(payload_hash, "hasher", hasher)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # this test's records only
    monkeypatch.setattr(payload_hash, "RACY_S", 0.0)
    monkeypatch.setattr(verified, "RACY_S", 0.0)
    payload_hash.forget_verified()
    yield n
    payload_hash.forget_verified()


def build(path, items=ITEMS) -> None:
    with PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.BUILD_IF_MISSING) as s:
        for k, v in items.items():
            s.put(k, v)
        assert s.flush() == len(items)


def read_all(path, keys=tuple(ITEMS), **kw) -> None:
    with PreparedModelStore(path, source_digest=SRC, policy=RO, **kw) as r:
        for k in keys:
            np.testing.assert_array_equal(r.read_payload(r.lookup(k)), ITEMS[k])


def records() -> list[dict]:
    folder = verified.default_dir()
    if not os.path.isdir(folder):
        return []
    out = []
    for n in sorted(os.listdir(folder)):
        with open(os.path.join(folder, n), "rb") as f:
            out.append(marshal.load(f))
    return out


def test_a_later_process_hashes_nothing_and_a_rewrite_is_hashed_again(tmp_path, hashers):
    path = tmp_path / "m.prepared.onnx"
    build(path)
    hashers["made"] = 0
    read_all(path)
    assert hashers["made"] == 2
    (rec,) = [r for r in records() if r["file"].endswith(".data")]
    assert sorted(rec["ranges"].values()) == sorted(e.checksum for e in
                                                    PreparedModelStore(path, source_digest=SRC, policy=RO)
                                                    .entries().values())
    payload_hash.forget_verified()  # a new process
    hashers["made"] = 0
    read_all(path)
    assert hashers["made"] == 0
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:  # a bit flip in place: same size and inode
        a = r.lookup(key("A"))
    with open(a.file, "r+b") as f:
        f.seek(a.offset + 5)
        byte = f.read(1)
        f.seek(a.offset + 5)
        f.write(bytes([byte[0] ^ 1]))
    payload_hash.forget_verified()
    hashers["made"] = 0
    with PreparedModelStore(path, source_digest=SRC, policy=RO) as r:
        with pytest.raises(CacheError, match="checksum mismatch"):
            r.read_payload(r.lookup(key("A")))
        assert r.lookup(key("A")) is None
    assert hashers["made"] == 1


def test_a_partial_read_is_recorded_at_close(tmp_path, hashers):
    path = tmp_path / "m.prepared.onnx"
    build(path)
    read_all(path, keys=(key("A"),))
    payload_hash.forget_verified()
    hashers["made"] = 0
    read_all(path)
    assert hashers["made"] == 1  # B only


def test_a_record_with_another_checksum_or_fingerprint_is_not_trusted(tmp_path, hashers):
    path = tmp_path / "m.prepared.onnx"
    build(path)
    read_all(path)
    folder = verified.default_dir()
    (name,) = os.listdir(folder)
    with open(os.path.join(folder, name), "rb") as f:
        rec = marshal.load(f)
    spoilers = (lambda r: r.update(ranges={k: "0" * 32 for k in r["ranges"]}),
                lambda r: r.update(fingerprint="1:2:3:4:5"))
    for spoil in spoilers:  # the record's checksums, then (as well) its fingerprint
        spoil(rec)
        with open(os.path.join(folder, name), "wb") as f:
            marshal.dump(rec, f)
        payload_hash.forget_verified()
        hashers["made"] = 0
        read_all(path)
        assert hashers["made"] == 2


def test_a_file_changed_just_now_gets_no_record(tmp_path, hashers, monkeypatch):
    monkeypatch.setattr(verified, "RACY_S", 3600.0)
    path = tmp_path / "m.prepared.onnx"
    build(path)
    read_all(path)
    assert records() == []
    payload_hash.forget_verified()
    hashers["made"] = 0
    read_all(path)
    assert hashers["made"] == 2


def test_without_locks_no_record_is_read_or_written(tmp_path, hashers):
    """Without locks (a network filesystem) timestamps may come from another host's clock: per store only."""
    path = tmp_path / "m.prepared.onnx"
    build(path)
    read_all(path)
    assert records()
    payload_hash.forget_verified()
    hashers["made"] = 0
    read_all(path, locking=False)
    assert hashers["made"] == 2
    path2 = tmp_path / "n" / "m.prepared.onnx"
    build(path2)
    before = len(records())
    read_all(path2, locking=False)
    assert len(records()) == before


def test_reading_a_companion_loads_no_writer_module(tmp_path):
    """A hit's constructor and reads skip what only a writer needs (secrets: random, base64, hmac)."""
    import subprocess
    import sys

    path = tmp_path / "m.prepared.onnx"
    build(path)
    code = ("import sys\nfrom onnx_prepared.prepared.cache import PreparedModelStore\n"
            f"with PreparedModelStore({str(path)!r}, source_digest={SRC!r}, policy='read_only') as r:\n"
            "    for e in r.entries().values():\n        r.read_payload(e)\n"
            "print(sorted(m for m in ('secrets', 'random', 'base64', 'hmac') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "[]"
