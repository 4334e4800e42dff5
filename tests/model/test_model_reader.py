"""ExternalDataReader: correct values for every dtype, offsets, `out`, concurrency, counters, late failures."""

from __future__ import annotations

import os
import threading

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_prepared.errors import ExternalDataError
from onnx_prepared.model import ExternalDataReader, load_model
from tests.model.model_builders import Spec, write_model

_rng = np.random.default_rng(1234)


def _floats(dtype, shape=(3, 5)):
    return _rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _ints(dtype, lo, hi, shape=(3, 5)):
    return _rng.integers(lo, hi, shape).astype(dtype)


VALUES = {
    "float32": _floats(np.float32),
    "float16": _floats(np.float16),
    "float64": _floats(np.float64, (2, 3, 4)),
    "bfloat16": _floats(ml_dtypes.bfloat16),
    "float8e4m3fn": _floats(ml_dtypes.float8_e4m3fn),
    "float8e5m2": _floats(ml_dtypes.float8_e5m2),
    "int8": _ints(np.int8, -128, 128),
    "uint8": _ints(np.uint8, 0, 256),
    "int16": _ints(np.int16, -(2**15), 2**15),
    "uint16": _ints(np.uint16, 0, 2**16),
    "int32": _ints(np.int32, -(2**31), 2**31),
    "uint32": _ints(np.uint32, 0, 2**32),
    "int64": _ints(np.int64, -(2**62), 2**62),
    "uint64": _ints(np.uint64, 0, 2**63),
    "bool": _ints(np.bool_, 0, 2),
    "complex64": (_floats(np.float32) + 1j * _floats(np.float32)).astype(np.complex64),
    "int4_odd": _ints(ml_dtypes.int4, -8, 8, (3, 3)),
    "int4_even": _ints(ml_dtypes.int4, -8, 8, (4, 2)),
    "uint4_odd": _ints(ml_dtypes.uint4, 0, 16, (7,)),
    "float4e2m1": _floats(ml_dtypes.float4_e2m1fn, (5,)),
    "int2": _ints(ml_dtypes.int2, -2, 2, (7,)),
    "uint2": _ints(ml_dtypes.uint2, 0, 4, (9,)),
    "scalar": np.array(3.25, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # bitwise: NaN/-0.0 safe, works for ml_dtypes


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every value twice, external (64-byte aligned, filler between) and inline; plus onnx's full load."""
    d = tmp_path_factory.mktemp("dtypes")
    specs = [Spec(f"x_{k}", v) for k, v in VALUES.items()] + [Spec(f"i_{k}", v, external=False)
                                                              for k, v in VALUES.items()]
    path = write_model(d, specs)
    full = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    return load_model(path), full


@pytest.mark.parametrize("where", ["x", "i"])
@pytest.mark.parametrize("key", list(VALUES))
def test_values_for_every_dtype(saved, key, where):
    m, full = saved
    d = m.weights[f"{where}_{key}"]
    assert d.is_external == (where == "x")
    with ExternalDataReader() as r:
        got = r.read(d)
        raw = r.read_bytes(d)
    _same(got, full[d.name])  # exactly what onnx's own loader produces
    _same(got, VALUES[key])
    assert not got.flags.writeable
    assert raw.dtype == np.uint8 and raw.size == d.nbytes
    assert raw.tobytes() == numpy_helper.from_array(VALUES[key]).raw_data


@pytest.mark.parametrize(
    ("elem_type", "vals", "expected"),
    [
        (onnx.TensorProto.FLOAT16, [1.5, -2.0, 0.25], np.array([1.5, -2.0, 0.25], np.float16)),
        (onnx.TensorProto.BFLOAT16, [1.5, -2.0, 0.25], np.array([1.5, -2.0, 0.25], ml_dtypes.bfloat16)),
        (onnx.TensorProto.INT4, [1, -2, 7], np.array([1, -2, 7], ml_dtypes.int4)),
        (onnx.TensorProto.BOOL, [True, False, True], np.array([True, False, True])),
        (onnx.TensorProto.INT64, [1, -(2**40), 3], np.array([1, -(2**40), 3], np.int64)),
    ],
)
def test_inline_typed_fields(tmp_path, elem_type, vals, expected):
    """Inline tensors stored in the typed *_data fields (not raw_data) read and re-encode correctly."""
    t = helper.make_tensor("w", elem_type, [3], vals)
    assert not t.HasField("raw_data")
    g = helper.make_graph([], "g", [], [helper.make_tensor_value_info("w", elem_type, [3])], initializer=[t])
    p = tmp_path / "m.onnx"
    p.write_bytes(helper.make_model(g).SerializeToString())
    d = load_model(p).weights["w"]
    r = ExternalDataReader()
    _same(r.read(d), expected)
    assert r.read_bytes(d).tobytes() == numpy_helper.from_array(expected).raw_data
    assert r.bytes_read == 0  # inline bytes are not counted


def test_many_tensors_one_file_at_aligned_offsets(tmp_path):
    vals = {f"w{i}": _rng.standard_normal(17 * (i + 1)).astype(np.float32) for i in range(12)}
    path = write_model(tmp_path, [Spec(k, v) for k, v in vals.items()], align=4096)
    m = load_model(path)
    offsets = [m.weights[k].payload.offset for k in vals]
    assert offsets == sorted(offsets) and all(o % 4096 == 0 for o in offsets) and len(set(offsets)) == 12
    with ExternalDataReader() as r:
        for k in reversed(list(vals)):  # out of file order
            _same(r.read(m.weights[k]), vals[k])
        assert r.open_files == 1 and r._pool.opens == 1  # one descriptor per file, shared


def test_read_bytes_into_out(tmp_path):
    v = np.arange(100, dtype=np.int32)
    d = load_model(write_model(tmp_path, [Spec("w", v)])).weights["w"]
    r = ExternalDataReader()
    big = np.full(1000, 7, np.uint8)
    got = r.read_bytes(d, out=big)
    assert np.shares_memory(got, big) and got.size == 400
    assert got.view(np.int32).tolist() == v.tolist()
    assert (big[400:] == 7).all()
    with pytest.raises(ValueError, match="needs 400"):
        r.read_bytes(d, out=np.empty(399, np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        r.read_bytes(d, out=np.empty(400, np.int8))
    with pytest.raises(ValueError, match="C-contiguous"):
        r.read_bytes(d, out=np.empty(800, np.uint8)[::2])
    ro = np.empty(400, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        r.read_bytes(d, out=ro)


def test_inline_read_bytes_into_out(tmp_path):
    v = np.arange(6, dtype=np.int16)
    d = load_model(write_model(tmp_path, [Spec("w", v, external=False)])).weights["w"]
    out = np.zeros(20, np.uint8)
    got = ExternalDataReader().read_bytes(d, out=out)
    assert np.shares_memory(got, out) and got.tobytes() == v.tobytes()


def test_bytes_read_counter(tmp_path):
    specs = [Spec(f"w{i}", np.ones(10 * (i + 1), np.float32)) for i in range(4)] + [
        Spec("inline", np.ones(50, np.float32), external=False)
    ]
    m = load_model(write_model(tmp_path, specs))
    r = ExternalDataReader()
    assert r.bytes_read == 0
    for name in ("w0", "w1", "w2", "w3", "inline"):
        r.read(m.weights[name])
    assert r.bytes_read == 4 * (10 + 20 + 30 + 40)
    r.read_bytes(m.weights["w0"])
    assert r.bytes_read == 4 * 110
    os.truncate(m.weights["w3"].payload.file, 0)
    with pytest.raises(ExternalDataError):
        r.read(m.weights["w3"])
    assert r.bytes_read == 4 * 110  # a failed read counts nothing
    r.close()


def test_concurrent_reads_from_one_reader(tmp_path):
    vals = {f"w{i}": _rng.integers(0, 2**31, 1000 + 37 * i).astype(np.int64) for i in range(24)}
    m = load_model(write_model(tmp_path, [Spec(k, v) for k, v in vals.items()]))
    r = ExternalDataReader()
    n_threads, rounds = 8, 5
    start = threading.Barrier(n_threads)  # everyone reads at once, including the first open of the file
    results: dict[tuple[int, str], np.ndarray] = {}
    errors: list[BaseException] = []

    def work(tid: int) -> None:
        try:
            start.wait()
            for rnd in range(rounds):
                for k in list(vals)[tid::2] if rnd % 2 else list(vals)[::-1]:
                    results[(tid, k)] = r.read(m.weights[k])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (_, k), got in results.items():
        np.testing.assert_array_equal(got, vals[k])
    expected = 0
    for tid in range(n_threads):
        for rnd in range(rounds):
            names = list(vals)[tid::2] if rnd % 2 else list(vals)
            expected += sum(vals[k].nbytes for k in names)
    assert r.bytes_read == expected
    assert r.open_files == 1
    r.close()


# ---- failures after load ------------------------------------------------------------------------


def _one(tmp_path, n=256):
    v = np.arange(n, dtype=np.float32)
    m = load_model(write_model(tmp_path, [Spec("a", v), Spec("w", v)], align=4096))
    return m.weights["w"], v


def _assert_names(e: ExternalDataError, desc) -> None:
    assert e.tensor == "w" and e.file == desc.payload.file
    assert "'w'" in str(e) and desc.payload.file in str(e)
    assert e.__cause__ is None


def test_file_shrank_after_load(tmp_path):
    d, _ = _one(tmp_path)
    os.truncate(d.payload.file, d.payload.offset + 10)
    with pytest.raises(ExternalDataError, match="shrank to 4106 bytes since load") as ei:
        ExternalDataReader().read(d)
    _assert_names(ei.value, d)


def test_file_shrinks_during_the_read(tmp_path, monkeypatch):
    """The size check passes, then the file loses its tail: pread returns 0 and that is an error too."""
    d, _ = _one(tmp_path)
    real = os.preadv
    calls = []

    def shrinking(fd, bufs, off):
        calls.append(off)
        if len(calls) == 1:
            return real(fd, [memoryview(bufs[0])[:100]], off)  # short read
        return 0  # EOF: the tail is gone

    monkeypatch.setattr(os, "preadv", shrinking)
    with pytest.raises(ExternalDataError, match="truncated: got 100 of 1024") as ei:
        ExternalDataReader().read(d)
    _assert_names(ei.value, d)


def test_short_reads_are_resumed(tmp_path, monkeypatch):
    d, v = _one(tmp_path)
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: real(fd, [memoryview(bufs[0])[:7]], off))
    np.testing.assert_array_equal(ExternalDataReader().read(d), v)


def test_io_error_is_wrapped(tmp_path, monkeypatch):
    d, _ = _one(tmp_path)

    def eio(*args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "preadv", eio)
    with pytest.raises(ExternalDataError, match="Input/output error") as ei:
        ExternalDataReader().read(d)
    _assert_names(ei.value, d)


def test_file_removed_after_load(tmp_path):
    d, _ = _one(tmp_path)
    os.remove(d.payload.file)
    with pytest.raises(ExternalDataError, match="file disappeared since load") as ei:
        ExternalDataReader().read(d)
    _assert_names(ei.value, d)


def test_file_swapped_for_a_symlink_after_load(tmp_path):
    d, _ = _one(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}_outside.bin"
    os.rename(d.payload.file, outside)
    os.symlink(outside, d.payload.file)
    with pytest.raises(ExternalDataError) as ei:
        ExternalDataReader().read(d)
    _assert_names(ei.value, d)
    os.remove(outside)


def test_close_is_idempotent_and_reads_reopen(tmp_path):
    d, v = _one(tmp_path)
    r = ExternalDataReader()
    r.read(d)
    r.close()
    r.close()
    np.testing.assert_array_equal(r.read(d), v)
    r.close()


# ---- transient reads (a prepack's source) ---------------------------------------------------------


def _mapped(a: np.ndarray) -> bool:
    from onnx_prepared.model.reader_map import is_mapped

    return is_mapped(a)


def test_transient_reads_map_instead_of_copying(tmp_path, monkeypatch):
    """A transient read of a large tensor is a read-only view of a file mapping with the same bytes (no
    anonymous copy); a small one, a read into ``out`` and a non-transient read copy; the switch turns it
    off. Each counts its bytes once."""
    from onnx_prepared.model import reader as reader_mod

    n = reader_mod.MAP_MIN_BYTES // 4 + 300  # float32 values: just above the threshold, odd offset in a page
    v = np.arange(n, dtype=np.float32)
    m = load_model(write_model(tmp_path, [Spec("a", v[:3]), Spec("w", v), Spec("s", v[:10])], align=64))
    w, s = m.weights["w"], m.weights["s"]
    assert w.payload.offset % 4096
    r = ExternalDataReader()
    assert not _mapped(r.read(w))
    r.mark_transient([w, s])
    got = r.read(w)
    assert _mapped(got) and not got.flags.writeable
    np.testing.assert_array_equal(got, v)
    assert not _mapped(r.read(s))  # too small to map
    out = np.empty(w.payload.length, np.uint8)
    assert not _mapped(r.read_bytes(w, out))
    assert r.bytes_read == 3 * w.payload.length + s.payload.length
    monkeypatch.setenv(reader_mod.MAP_ENV, "0")
    again = r.read(w)
    assert not _mapped(again)
    np.testing.assert_array_equal(again, v)


def test_a_transient_read_checks_the_file_size_first(tmp_path):
    d, _ = _one(tmp_path, n=1 << 17)  # 512 KiB: mapped when it fits
    os.truncate(d.payload.file, d.payload.offset + 10)
    r = ExternalDataReader()
    r.mark_transient([d])
    with pytest.raises(ExternalDataError, match="shrank to"):
        r.read(d)
