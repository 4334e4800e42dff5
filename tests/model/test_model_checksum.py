"""sha256 checksums recorded in external_data: verified on the first read of the bytes, never at load."""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest
from onnx import numpy_helper

from onnx_prepared.errors import ExternalDataError
from onnx_prepared.model import ExternalDataReader, load_model, recorded_sha256, sha256_hex, verify_checksum
from tests.model.model_builders import Spec, write_model

V = np.arange(64, dtype=np.float32)
DIGEST = hashlib.sha256(V.tobytes()).hexdigest()


def _desc(tmp_path, checksum, value=V, external=True):
    entries = {"checksum": checksum} if checksum is not None else {}
    return load_model(write_model(tmp_path, [Spec("w", value, external=external, entries=entries)])).weights["w"]


@pytest.mark.parametrize("form", [DIGEST, DIGEST.upper(), f"sha256:{DIGEST}", f" {DIGEST}\n"])
def test_matching_checksum(tmp_path, form):
    d = _desc(tmp_path, form)
    assert d.checksum == form  # kept as recorded
    assert recorded_sha256(d) == DIGEST
    raw = ExternalDataReader().read_bytes(d)
    assert verify_checksum(d, raw)
    assert verify_checksum(d, raw.tobytes())
    assert verify_checksum(d, ExternalDataReader().read(d))  # plain dtypes: the array's bytes are the stored bytes


def test_mismatch_raises_on_read(tmp_path):
    d = _desc(tmp_path, hashlib.sha256(b"other").hexdigest())
    with pytest.raises(ExternalDataError, match="checksum mismatch") as ei:
        ExternalDataReader().read_bytes(d)
    assert ei.value.tensor == "w" and ei.value.file == d.payload.file
    with pytest.raises(ExternalDataError, match="checksum mismatch"):
        ExternalDataReader().read(d)


def test_corrupted_file_is_caught(tmp_path):
    d = _desc(tmp_path, DIGEST)
    with open(d.payload.file, "r+b") as f:
        f.seek(d.payload.offset + 5)
        f.write(b"\xff")
    with pytest.raises(ExternalDataError, match="checksum mismatch"):
        ExternalDataReader().read_bytes(d)


def test_rewrite_in_place_after_a_verified_read_is_caught(tmp_path):
    """Verification is cached per file fingerprint: a same-size rewrite changes it, so the next read re-hashes."""
    d = _desc(tmp_path, DIGEST)
    r = ExternalDataReader()
    r.read_bytes(d)
    sha, fp = r.source_digest(d)
    assert sha == DIGEST and fp == d.payload.fingerprint
    r.close()  # the pool reopens: a rewrite through another descriptor changes mtime/ctime
    with open(d.payload.file, "r+b") as f:
        f.seek(d.payload.offset)
        f.write(b"\x01\x02")
    with pytest.raises(ExternalDataError, match="checksum mismatch"):
        r.read_bytes(d)


def test_hash_reads_records_digest_without_checksum(tmp_path):
    d = _desc(tmp_path, None)
    assert ExternalDataReader().source_digest(d) is None
    r = ExternalDataReader(hash_reads=True)
    r.read(d)
    assert r.source_digest(d) == (DIGEST, d.payload.fingerprint)


@pytest.mark.parametrize("checksum", [None, "", hashlib.sha1(V.tobytes()).hexdigest(), "z" * 64])
def test_no_sha256_recorded(tmp_path, checksum):
    d = _desc(tmp_path, checksum)
    assert recorded_sha256(d) is None
    with pytest.raises(ValueError, match="no sha256"):
        verify_checksum(d, b"")


def test_inline_has_no_checksum(tmp_path):
    d = _desc(tmp_path, None, external=False)
    assert d.checksum is None and recorded_sha256(d) is None


def test_packed_types_need_stored_bytes(tmp_path):
    q = np.array([1, -2, 3, 4, -5], ml_dtypes.int4)
    raw = np.frombuffer(numpy_helper.from_array(q).raw_data, np.uint8)
    d = _desc(tmp_path, hashlib.sha256(raw.tobytes()).hexdigest(), q)
    r = ExternalDataReader()
    assert verify_checksum(d, r.read_bytes(d))
    with pytest.raises(ValueError, match="stored bytes"):
        verify_checksum(d, r.read(d))


def test_sha256_hex_of_arrays():
    a = np.arange(10, dtype=np.int64).reshape(2, 5)
    assert sha256_hex(a) == hashlib.sha256(a.tobytes()).hexdigest()
    assert sha256_hex(a.T) == hashlib.sha256(np.ascontiguousarray(a.T).tobytes()).hexdigest()
    b = np.ones(3, ml_dtypes.bfloat16)
    assert sha256_hex(b) == hashlib.sha256(b.tobytes()).hexdigest()
