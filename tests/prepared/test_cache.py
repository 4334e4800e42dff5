"""PreparedModelStore: the companion prepared ONNX model (format, lookup rules, corruption rules, policies)."""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np
import onnx
import pytest
import xxhash

from onnx_prepared.errors import CacheError
from onnx_prepared.kernels.prepack import KERNEL_ABI
from onnx_prepared.prepared import cache_io
from onnx_prepared.prepared.cache import (
    FORMAT_VERSION,
    PreparedModelPolicy,
    PreparedModelStore,
    default_prepared_path,
    info,
    source_model_digest,
    verify,
)
from onnx_prepared.prepared.cache_format import ID_SIZE
from onnx_prepared.resolve.keys import PreparedKey

SRC = hashlib.sha256(b"source model").hexdigest()
BUILD, RO = PreparedModelPolicy.BUILD_IF_MISSING, PreparedModelPolicy.READ_ONLY


def dig(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def key(name: str = "W", layout: str = "gemm_b:t1", device: str = "cpu", digest: str | None = "auto") -> PreparedKey:
    names = tuple(name.split("+"))
    return PreparedKey(names, layout, device, dig(name + layout) if digest == "auto" else digest)


def payload(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def build(path, items: dict[PreparedKey, np.ndarray], **kw) -> PreparedModelStore:
    s = PreparedModelStore(path, source_digest=kw.pop("source_digest", SRC), policy=BUILD, **kw)
    for k, v in items.items():
        s.put(k, v)
    assert s.flush() == len(items)
    return s


def snapshot(folder) -> dict[str, tuple[int, str]]:
    out = {}
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        st = os.stat(p)
        with open(p, "rb") as f:
            out[name] = (st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
    return out


def flip(file, offset: int) -> None:
    """Flip one bit of ``file`` at ``offset``."""
    with open(file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def data_files(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".data"))


# ---- round trip and format --------------------------------------------------------------------------


def test_round_trip_put_flush_reopen_lookup_read(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    a, b, z = key("W"), key("A+B", "nbits:q4:b32"), key("Z")
    pa, pb = payload(1, 10_000), payload(2, 33)
    s = build(path, {a: pa, b: pb, z: np.zeros(0, np.uint8)})
    assert s.lookup(a) is not None  # the writer sees its own generation at once
    s.close()
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    ea, eb = r.lookup(a), r.lookup(b)
    assert ea.lineage == ("W",) and eb.lineage == ("A", "B") and eb.layout == "nbits:q4:b32"
    assert (ea.length, eb.length) == (10_000, 33)
    np.testing.assert_array_equal(r.read_payload(ea), pa)
    out = np.full(50, 7, dtype=np.uint8)
    got = r.read_payload(eb, out=out)
    np.testing.assert_array_equal(got, pb)
    assert got.base is out or np.shares_memory(got, out)
    assert r.read_payload(r.lookup(z)).shape == (0,)
    assert r.bytes_read == 10_033
    assert set(r.entries()) == {"prepared/W@gemm_b:t1", "prepared/A+B@nbits:q4:b32", "prepared/Z@gemm_b:t1"}
    # any dtype is stored as its bytes
    f = np.linspace(0, 1, 7, dtype=np.float32)
    build(path, {key("F"): f}).close()
    assert r.read_payload(PreparedModelStore(path, source_digest=SRC, policy=RO).lookup(key("F"))).view(
        np.float32).tolist() == f.tolist()
    assert r.generation == 1 and r.invalid == {} and r.stale_reason is None


def test_companion_format_key_names_alignment_and_onnx_parses(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    k1, k2, k3 = key("W"), key("Q,K+V", "qkv"), key("W", "gemm_b:t1", device="cuda:0")
    build(path, {k1: payload(1, 5000), k2: payload(2, 1), k3: payload(3, 4096)})
    m = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(str(path))
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["onnx_light.prepared.format_version"] == FORMAT_VERSION == "5"
    assert meta["onnx_light.prepared.payload_checksum"] == "xxh3_128"
    assert meta["onnx_light.prepared.source_model_digest"] == SRC
    assert meta["onnx_light.prepared.kernel_abi"] == KERNEL_ABI
    assert len(m.graph.node) == 0
    by_name = {t.name: t for t in m.graph.initializer}
    assert set(by_name) == {"prepared/W@gemm_b:t1", "prepared/Q,K+V@qkv", "prepared/W@gemm_b:t1@cuda:0"}
    offsets = []
    for t in m.graph.initializer:
        assert t.data_type == onnx.TensorProto.UINT8 and len(t.dims) == 1
        assert t.data_location == onnx.TensorProto.EXTERNAL
        ext = {e.key: e.value for e in t.external_data}
        assert set(ext) == {"location", "offset", "length", "checksum"}
        assert int(ext["offset"]) % 4096 == 0 and int(ext["length"]) == t.dims[0]
        offsets.append(int(ext["offset"]))
        with open(tmp_path / ext["location"], "rb") as f:
            f.seek(int(ext["offset"]))
            assert ext["checksum"] == "xxh3_128:" + xxhash.xxh3_128(f.read(int(ext["length"]))).hexdigest()
        md = {p.key: p.value for p in t.metadata_props}
        for k in ("source_lineage_digest", "source_lineage", "layout", "device", "kernel_abi", "format_version"):
            assert f"onnx_light.prepack.{k}" in md
        assert md["onnx_light.prepack.kernel_abi"] == KERNEL_ABI
        assert md["onnx_light.prepack.format_version"] == FORMAT_VERSION
    t2 = {p.key: p.value for p in by_name["prepared/Q,K+V@qkv"].metadata_props}
    assert t2["onnx_light.prepack.source_lineage"] == "Q,K,V"  # joined by ","; exact list kept as JSON too
    assert t2["onnx_light.prepack.source_lineage_json"] == '["Q,K", "V"]'
    assert t2["onnx_light.prepack.source_lineage_digest"] == k2.lineage_digest
    assert sorted(offsets) == [0, 8192, 12288]  # put order: 5000 bytes at 0, 1 byte at 8192, then 12288
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(k2).lineage == ("Q,K", "V") and r.lookup(k3).device == "cuda:0"


def test_source_model_digest_and_default_path(tmp_path, monkeypatch):
    import onnx
    from onnx import TensorProto, helper

    def tiny(op, checksum):
        t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2], data_location=TensorProto.EXTERNAL)
        t.external_data.add(key="location", value="tiny.data")
        t.external_data.add(key="checksum", value=checksum)
        g = helper.make_graph([helper.make_node(op, ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [t])
        return helper.make_model(g).SerializeToString()

    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny("Add", "ab" * 32))
    d = source_model_digest(model)
    assert len(d) == 64
    other = tmp_path / "other.onnx"
    other.write_bytes(tiny("Add", "cd" * 32))
    assert source_model_digest(other) == d  # a weight's content changed: entries miss one by one
    other.write_bytes(tiny("Mul", "ab" * 32))
    assert source_model_digest(other) != d  # another graph: another identity
    assert source_model_digest(other, onnx.load(other, load_external_data=False)) == source_model_digest(other)
    copy = tmp_path / "sub" / "tiny.onnx"
    copy.parent.mkdir()
    copy.write_bytes(model.read_bytes())
    os.utime(copy, (1, 1))
    assert source_model_digest(copy) == d  # identity ignores path and timestamps
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    part = hashlib.sha256(f"{d}\n{os.path.realpath(tmp_path / 'tiny.data')}".encode()).hexdigest()[:16]
    want = str(tmp_path / "xdg" / "onnx-prepared" / "prepared" / part / "tiny.prepared.onnx")
    assert default_prepared_path(model) == default_prepared_path(model, digest=d) == want
    # byte-identical .onnx in another folder (other data file): another companion
    assert default_prepared_path(copy) != want and source_model_digest(copy) == d
    with pytest.raises(CacheError, match=r"missing\.onnx"):
        source_model_digest(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not really a model")
    with pytest.raises(CacheError, match=r"junk\.onnx"):
        source_model_digest(tmp_path / "junk.onnx")


# ---- hit / miss / stale -----------------------------------------------------------------------------


def test_lookup_hit_and_every_kind_of_miss(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    k = key("W")
    build(path, {k: payload(1, 100)}).close()
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(k) is not None and r.explain_miss(k) is None
    misses = {
        "stale": PreparedKey(("W",), "gemm_b:t1", "cpu", dig("changed weights")),
        "unknown digest": PreparedKey(("W",), "gemm_b:t1", "cpu", None),
        "layout": PreparedKey(("W",), "gemm_b:t0", "cpu", k.lineage_digest),
        "device": PreparedKey(("W",), "gemm_b:t1", "cuda", k.lineage_digest),
        "lineage": PreparedKey(("W", "b"), "gemm_b:t1", "cpu", k.lineage_digest),
    }
    for what, other in misses.items():
        assert r.lookup(other) is None, what
    assert "stale" in r.explain_miss(misses["stale"])
    assert "unknown" in r.explain_miss(misses["unknown digest"])
    assert "no entry" in r.explain_miss(misses["layout"])
    assert r.bytes_read == 0
    other_abi = PreparedModelStore(path, source_digest=SRC, policy=RO, kernel_abi="onnx-prepared-cpu-v2")
    assert other_abi.lookup(k) is None and "kernel ABI" in other_abi.explain_miss(k)
    with pytest.raises(CacheError, match=r"no compatible entry for 'prepared/W@gemm_b:t1'.*kernel ABI"):
        other_abi.require(k)
    assert r.require(k).key_name == "prepared/W@gemm_b:t1"


def _rewrite(path, fn) -> None:
    m = onnx.load(str(path), load_external_data=False)
    fn(m)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def _set(props, key, value) -> None:
    for p in props:
        if p.key == key:
            p.value = value
            return
    raise AssertionError(key)


def test_other_packed_format_version_is_a_miss(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    k = key("W")
    build(path, {k: payload(1, 100)}).close()
    _rewrite(path, lambda m: _set(m.graph.initializer[0].metadata_props, "onnx_light.prepack.format_version", "0"))
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(k) is None and "packed format version" in r.explain_miss(k)
    assert len(r.entries()) == 1  # kept, just not compatible


@pytest.mark.parametrize("version", ["4", "999"])  # 4: panel16 payloads with a 64-byte header
def test_other_container_version_or_source_model_is_empty_and_replaced_by_build(tmp_path, version):
    path = tmp_path / "m.prepared.onnx"
    k = key("W")
    build(path, {k: payload(1, 100)}).close()
    old_data = data_files(tmp_path)
    other = PreparedModelStore(path, source_digest=dig("another model"), policy=RO)
    assert other.entries() == {} and other.lookup(k) is None and "another source model" in other.stale_reason
    _rewrite(path, lambda m: _set(m.metadata_props, "onnx_light.prepared.format_version", version))
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.entries() == {} and f"format version '{version}'" in r.explain_miss(k)
    # build_if_missing replaces it wholesale, and removes the data file only the old companion used
    b = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    b.put(k, payload(5, 200))
    assert b.flush() == 1
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    np.testing.assert_array_equal(r.read_payload(r.lookup(k)), payload(5, 200))
    assert old_data[0] not in data_files(tmp_path) and len(data_files(tmp_path)) == 1
    assert verify(path) == []


def test_stale_entry_is_replaced_and_others_preserved(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    a, b = key("A"), key("B")
    build(path, {a: payload(1, 100), b: payload(2, 100)}).close()
    a2 = PreparedKey(("A",), a.layout, "cpu", dig("A changed"))
    s = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    assert s.lookup(a2) is None
    s.put(a2, payload(3, 300))
    s.put(b, payload(2, 100))  # already cached and compatible: not rewritten
    assert s.flush() == 1
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(a) is None and r.lookup(a2).length == 300 and r.lookup(b).length == 100
    assert r.generation == 2 and len(data_files(tmp_path)) == 2  # b still lives in generation 1's file
    assert verify(path) == []


# ---- metadata-only open -----------------------------------------------------------------------------


def test_open_and_lookup_read_no_payload_byte(tmp_path, monkeypatch):
    path = tmp_path / "m.prepared.onnx"
    k = key("W")
    build(path, {k: payload(1, 50_000)}).close()

    def refuse(*a, **kw):
        raise AssertionError("payload bytes read during open/lookup")

    for name in ("pread", "preadv", "read", "readv", "mmap"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    monkeypatch.setattr(np, "fromfile", refuse)
    real_open = open

    def guarded_open(file, *a, **kw):
        if str(file).endswith(".data"):
            raise AssertionError(f"payload file opened with open(): {file}")
        return real_open(file, *a, **kw)

    monkeypatch.setattr("builtins.open", guarded_open)
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    e = r.lookup(k)
    assert e is not None and r.bytes_read == 0
    monkeypatch.undo()
    np.testing.assert_array_equal(r.read_payload(e), payload(1, 50_000))


# ---- corruption -------------------------------------------------------------------------------------


def test_bit_flip_raises_on_read_and_verify_reports_it(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    a, b = key("A"), key("B")
    s = build(path, {a: payload(1, 9000), b: payload(2, 9000)})
    ea = s.lookup(a)
    flip(ea.file, ea.offset + 1234)
    r = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    ea = r.lookup(a)  # the manifest is fine: only the read finds out
    with pytest.raises(CacheError, match=r"'prepared/A@gemm_b:t1'.*checksum mismatch"):
        r.read_payload(ea)
    assert r.lookup(a) is None and "checksum" in r.invalid["prepared/A@gemm_b:t1"]
    np.testing.assert_array_equal(r.read_payload(r.lookup(b)), payload(2, 9000))
    problems = verify(path)
    assert len(problems) == 1 and "prepared/A@gemm_b:t1" in problems[0] and "checksum mismatch" in problems[0]
    # the rebuilt object replaces the corrupt record at the next flush
    r.put(a, payload(1, 9000))
    assert r.flush() == 1 and verify(path) == []


def test_truncated_and_missing_payload_files_invalidate_only_their_entries(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    a, b = key("A"), key("B")
    build(path, {a: payload(1, 9000)}).close()
    build(path, {b: payload(2, 9000)}).close()  # generation 2: B lives in its own data file
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    fa, fb = r.lookup(a).file, r.lookup(b).file
    r.close()
    with open(fa, "r+b") as f:
        f.truncate(5000)
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(a) is None and "truncated" in r.invalid["prepared/A@gemm_b:t1"]
    assert r.lookup(b) is not None
    assert any("prepared/A@gemm_b:t1" in p and "truncated" in p for p in verify(path))
    os.unlink(fb)
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(b) is None and "missing" in r.invalid["prepared/B@gemm_b:t1"]
    problems = verify(path)
    assert len(problems) == 2 and any("prepared/B@gemm_b:t1" in p and "missing" in p for p in problems)


def test_file_truncated_after_open_raises_on_read(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    a = key("A")
    build(path, {a: payload(1, 9000)}).close()
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    e = r.lookup(a)
    with open(e.file, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CacheError, match="truncated: 100 of 9000"):
        r.read_payload(e)


def _corrupt_cases():
    def escape(m):
        for x in m.graph.initializer[0].external_data:
            if x.key == "location":
                x.value = "../outside.data"

    def absolute(m):
        for x in m.graph.initializer[0].external_data:
            if x.key == "location":
                x.value = "/etc/passwd"

    def drop_meta(m):
        del m.graph.initializer[0].metadata_props[0]

    def wrong_type(m):
        m.graph.initializer[0].data_type = onnx.TensorProto.FLOAT

    def rename(m):
        m.graph.initializer[0].name = "prepared/Other@gemm_b:t1"

    def drop_source(m):
        del m.metadata_props[[p.key for p in m.metadata_props].index("onnx_light.prepared.source_model_digest")]

    def duplicate(m):
        m.graph.initializer.add().CopyFrom(m.graph.initializer[0])

    return {
        "location escapes ('..')": (escape, "escapes the cache folder"),
        "absolute location": (absolute, "absolute"),
        "metadata key missing": (drop_meta, "missing keys: onnx_light.prepack.source_lineage_digest"),
        "not UINT8": (wrong_type, "1-D UINT8"),
        "name disagrees with metadata": (rename, "does not match its metadata"),
        "source digest missing": (drop_source, "lacks onnx_light.prepared.source_model_digest"),
        "duplicate": (duplicate, "duplicate entry name"),
    }


@pytest.mark.parametrize("case", list(_corrupt_cases()))
def test_structurally_corrupt_manifest_raises_naming_file_and_entry(tmp_path, case):
    fn, message = _corrupt_cases()[case]
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("W"): payload(1, 100)}).close()
    _rewrite(path, fn)
    with pytest.raises(CacheError, match=message) as ei:
        PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert str(path) in str(ei.value)
    if case != "source digest missing":
        assert "prepared/" in str(ei.value)
    assert any(message.split(":")[0] in p for p in verify(path))


def test_symlink_out_of_folder_is_corrupt(tmp_path):
    path = tmp_path / "c" / "m.prepared.onnx"
    s = build(path, {key("W"): payload(1, 100)})
    f = s.lookup(key("W")).file
    s.close()
    outside = tmp_path / "elsewhere.data"
    os.replace(f, outside)
    os.symlink(outside, f)
    with pytest.raises(CacheError, match="resolves outside the cache folder"):
        PreparedModelStore(path, source_digest=SRC, policy=RO)


@pytest.mark.parametrize("content", [b"", b"\x08\x07garbage\xff\xff\xff", b"definitely not protobuf \x00\x01"])
def test_unparseable_manifest_raises_naming_the_file(tmp_path, content):
    path = tmp_path / "m.prepared.onnx"
    path.write_bytes(content)
    with pytest.raises(CacheError, match=r"m\.prepared\.onnx"):
        PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert len(verify(path)) == 1
    with pytest.raises(CacheError):
        info(path)


def test_truncated_manifest_raises(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("W"): payload(1, 100), key("V"): payload(2, 100)}).close()
    data = path.read_bytes()
    for cut in range(1, len(data), max(1, len(data) // 40)):
        path.write_bytes(data[:cut])
        try:
            s = PreparedModelStore(path, source_digest=SRC, policy=RO)
        except CacheError:
            continue
        # a cut that still parses must not produce an entry that lies about its payload
        for e in s.entries().values():
            if e.key_name not in s.invalid:
                np.testing.assert_array_equal(s.read_payload(e), payload(1 if "W" in e.key_name else 2, 100))


# ---- policies ---------------------------------------------------------------------------------------


def test_read_only_never_creates_or_modifies_a_file(tmp_path):
    folder = tmp_path / "c"
    path = folder / "m.prepared.onnx"
    # no companion at all: nothing is created
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    r.put(key("W"), payload(1, 10))
    r.record_source_digest("W", dig("w"))
    assert r.flush() == 0 and not folder.exists()
    assert r.source_digest_of("W") == dig("w")  # remembered in memory for this session only
    build(path, {key("A"): payload(1, 100)}).close()
    before = snapshot(folder)
    for policy in (RO, PreparedModelPolicy.REQUIRE_COMPLETE):
        r = PreparedModelStore(path, source_digest=SRC, policy=policy)
        r.put(key("B"), payload(2, 10))
        r.record_source_digest("B", dig("b"))
        r.read_payload(r.lookup(key("A")))
        assert r.flush() == 0
        r.close()
        assert snapshot(folder) == before
    # a corrupt entry found by a read-only reader is not repaired on disk either
    e = PreparedModelStore(path, source_digest=SRC, policy=RO).lookup(key("A"))
    flip(e.file, e.offset + 3)
    before = snapshot(folder)
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    with pytest.raises(CacheError):
        r.read_payload(r.lookup(key("A")))
    r.put(key("A"), payload(1, 100))
    r.flush()
    assert snapshot(folder) == before


def test_read_only_works_in_a_read_only_folder(tmp_path):
    folder = tmp_path / "c"
    path = folder / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 100)}).close()
    os.chmod(folder, 0o555)
    try:
        r = PreparedModelStore(path, source_digest=SRC, policy=RO)
        np.testing.assert_array_equal(r.read_payload(r.lookup(key("A"))), payload(1, 100))
    finally:
        os.chmod(folder, 0o755)


def test_disabled_opens_nothing(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    path.write_bytes(b"corrupt, but never read")
    s = PreparedModelStore(path, source_digest=SRC, policy="disabled")
    assert s.entries() == {} and s.lookup(key("W")) is None
    s.put(key("W"), payload(1, 10))
    assert s.flush() == 0


def test_put_without_lineage_digest_is_not_persisted(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    s = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    s.put(key("W", digest=None), payload(1, 10))
    assert s.pending == 0 and s.flush() == 0 and not path.exists()


# ---- sidecar source digests -------------------------------------------------------------------------


def test_source_digests_persist_for_the_same_model_only(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    s = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    s.record_source_digest("W", dig("w"))
    s.record_source_digest("V", "sha256:" + dig("v").upper(), stamp="4096:123")
    assert s.flush() == 0  # digests only: a manifest generation, no payload entry
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.source_digest_of("W") == dig("w") and r.source_digest_of("V") == dig("v")
    assert r.source_digest_of("V", stamp="4096:123") == dig("v")
    assert r.source_digest_of("V", stamp="4096:999") is None  # the data file changed since
    assert r.source_digest_of("missing") is None
    assert PreparedModelStore(path, source_digest=dig("other"), policy=RO).source_digest_of("W") is None
    m = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in m.metadata_props}
    assert '"W":"' + dig("w") + '"' in meta["onnx_light.prepared.source_digests"]
    # recording an already persisted digest queues nothing (no new generation every session)
    b = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    b.record_source_digest("W", dig("w"))
    before = snapshot(tmp_path)
    b.flush()
    assert snapshot(tmp_path) == before
    with pytest.raises(ValueError, match="not a hex sha256"):
        b.record_source_digest("W", "abc")


# ---- in-process merging, cleanup, threads -----------------------------------------------------------


def test_two_stores_merge_and_unreferenced_files_are_removed(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    a, b, c = key("A"), key("B"), key("C")
    s1 = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    s2 = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    s1.put(a, payload(1, 100))
    s2.put(b, payload(2, 100))
    assert s1.flush() == 1 and s2.flush() == 1
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert r.lookup(a) is not None and r.lookup(b) is not None and r.generation == 2
    # replace both A and B: their old files become unreferenced and are deleted; C's new file stays
    a2, b2 = (PreparedKey(k.lineage, k.layout, "cpu", dig(str(k) + "v2")) for k in (a, b))
    s3 = build(path, {a2: payload(3, 100), b2: payload(4, 100), c: payload(5, 100)})
    assert len(data_files(tmp_path)) == 1
    # the reader opened before still reads generation 2's payloads (its descriptors hold the files)
    np.testing.assert_array_equal(r.read_payload(r.lookup(a)), payload(1, 100))
    # leftovers of a dead writer are removed by the next flush
    (tmp_path / ".m.prepared.0123456789abcdef.data.tmp").write_bytes(b"x")
    (tmp_path / ".m.prepared.fedcba9876543210.onnx.tmp").write_bytes(b"x")
    (tmp_path / "m.prepared.00000000000000aa.data").write_bytes(b"orphan")
    (tmp_path / "unrelated.data").write_bytes(b"not ours")
    s3.put(key("D"), payload(6, 10))
    s3.flush()
    assert set(os.listdir(tmp_path)) == {"m.prepared.onnx", "m.prepared.lock", "unrelated.data", *_referenced(path)}
    assert len(_referenced(path)) == 2
    assert verify(path) == []


def _referenced(path) -> list[str]:
    m = onnx.load(str(path), load_external_data=False)
    return sorted({e.value for t in m.graph.initializer for e in t.external_data if e.key == "location"})


def test_live_writers_temp_file_is_not_removed(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 10)}).close()
    lock_fd = cache_io.open_lock(str(tmp_path / "m.prepared.lock"), create=True)
    with cache_io.flocked(lock_fd, exclusive=False):
        tmp, fd = cache_io.create_temp_data(str(tmp_path), "m.prepared", "00112233445566ff")
    os.close(lock_fd)
    try:
        build(path, {key("B"): payload(2, 10)}).close()
        assert os.path.exists(tmp)  # still flock-ed by its (live) writer
    finally:
        os.close(fd)
    build(path, {key("C"): payload(3, 10)}).close()
    assert not os.path.exists(tmp)


def test_failed_flush_keeps_queue_and_previous_generation(tmp_path, monkeypatch):
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 10)}).close()
    s = PreparedModelStore(path, source_digest=SRC, policy=BUILD)
    s.put(key("B"), payload(2, 10))

    def fail(stage):
        if stage == "manifest_written":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_io, "checkpoint", fail)
    with pytest.raises(CacheError, match="No space"):  # our error; the run is unaffected
        s.flush()
    assert s.pending == 1 and verify(path) == []
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    monkeypatch.undo()
    assert s.flush() == 1
    assert set(PreparedModelStore(path, source_digest=SRC, policy=RO).entries()) == {
        "prepared/A@gemm_b:t1", "prepared/B@gemm_b:t1"}


def test_concurrent_reads_and_flush_from_threads(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    keys = [key(f"W{i}") for i in range(16)]
    s = build(path, {k: payload(i, 5000 + i) for i, k in enumerate(keys)})
    start = threading.Barrier(5)
    errors: list[BaseException] = []

    def reader(off: int) -> None:
        try:
            start.wait()
            for j in range(64):
                i = (j + off) % 16
                np.testing.assert_array_equal(s.read_payload(s.lookup(keys[i])), payload(i, 5000 + i))
        except BaseException as e:
            errors.append(e)

    def writer() -> None:
        try:
            start.wait()
            for i in range(8):
                s.put(key(f"N{i}"), payload(100 + i, 100))
                s.flush()
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(o,)) for o in range(4)] + [threading.Thread(target=writer)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert s.bytes_read == sum(5000 + (j + o) % 16 for o in range(4) for j in range(64))
    assert len(PreparedModelStore(path, source_digest=SRC, policy=RO).entries()) == 24
    assert verify(path) == []


def test_info_summarises(tmp_path):
    path = tmp_path / "m.prepared.onnx"
    build(path, {key("A"): payload(1, 100), key("B", "nbits"): payload(2, 5000),
                 key("C", device="cuda"): payload(3, 1)}).close()
    i = info(path)
    assert i["entries"] == 3 and i["total_bytes"] == 5101 and i["format_version"] == FORMAT_VERSION
    assert i["layouts"] == {"gemm_b:t1": 2, "nbits": 1} and i["devices"] == {"cpu": 2, "cuda": 1}
    assert i["kernel_abis"] == {KERNEL_ABI: 3} and i["source_model_digest"] == SRC and i["generation"] == 1
    (f, size), = i["data_files"].items()
    assert size == os.path.getsize(tmp_path / f) == 12288 + 1 + ID_SIZE  # put order: A@0, B@4096, C@12288 + its id


@pytest.mark.parametrize("at", [0, 4095, 4096, 9999])
def test_payload_is_hashed_piece_by_piece_as_it_is_read(tmp_path, monkeypatch, at):
    """XXH3-128 over 4 KiB pieces (CHUNK shrunk): a flip in any piece, first or last, is caught; intact
    bytes read whole, with the identity record after the last piece."""
    from onnx_prepared.prepared import payload_hash

    monkeypatch.setattr(payload_hash, "CHUNK", 4096)
    path = tmp_path / "m.prepared.onnx"
    a = key("A")
    build(path, {a: payload(1, 10_000)}).close()
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    np.testing.assert_array_equal(r.read_payload(r.lookup(a)), payload(1, 10_000))
    e = r.lookup(a)
    flip(e.file, e.offset + at)
    r2 = PreparedModelStore(path, source_digest=SRC, policy=RO)
    with pytest.raises(CacheError, match="checksum mismatch"):
        r2.read_payload(r2.lookup(a), out=np.empty(12_000, np.uint8))
    assert verify(path) and "checksum mismatch" in verify(path)[0]


def test_a_copied_payload_starts_on_a_cache_line(tmp_path, monkeypatch):
    # without a mapping (ONNX_PREPARED_CACHE_MMAP=0) a payload is copied into a fresh buffer: it must start
    # on a 64-byte line as packed weights do (np.empty's large buffers start 16 bytes into a page)
    monkeypatch.setenv("ONNX_PREPARED_CACHE_MMAP", "0")
    path = tmp_path / "m.prepared.onnx"
    pa = payload(3, 300_000)
    build(path, {key("W"): pa}).close()
    r = PreparedModelStore(path, source_digest=SRC, policy=RO)
    assert not r.mapping
    got = r.read_payload(r.lookup(key("W")))
    assert got.ctypes.data % 64 == 0 and got.flags.c_contiguous and got.size == 300_000
    np.testing.assert_array_equal(got, pa)
