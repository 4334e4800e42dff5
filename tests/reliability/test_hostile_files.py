"""Hostile files at every open: FIFOs, devices, huge claims, many files, huge numbers, bad versions.

Each case runs through ``bounded``: a hang fails the test (within ``HANG_SECONDS``) instead of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import (
    CacheError,
    ExternalDataError,
    ModelLoadError,
    OnnxPreparedError,
    ResourceLimitError,
    UnsupportedOpError,
)
from onnx_prepared.model import ExternalDataReader, load_model
from onnx_prepared.model.safe_open import FdPool, open_regular
from tests.model.model_builders import Spec, write_model
from tests.reliability.bounded import bounded

V = np.arange(64, dtype=np.float32)


def _raises(fn, cls, match=None):
    value, err = bounded(fn)
    assert err is not None, f"expected {cls.__name__}, got a result {value!r}"
    assert isinstance(err, cls), f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    if match is not None:
        assert match in str(err), str(err)
    return err


# ---- FIFOs and devices ----------------------------------------------------------------------------


def test_fifo_model_path_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    _raises(lambda: load_model(fifo), ModelLoadError, "FIFO")


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_device_model_path_is_refused_without_reading(path):
    _raises(lambda: load_model(path), ModelLoadError, "character device")


def test_directory_model_path(tmp_path):
    _raises(lambda: load_model(tmp_path), ModelLoadError, "directory")


def test_data_file_replaced_by_fifo_after_load_is_refused_at_read(tmp_path):
    m = load_model(write_model(tmp_path, [Spec("w", V)]))
    data = m.weights["w"].payload.file
    os.unlink(data)
    os.mkfifo(data)
    err = _raises(lambda: ExternalDataReader().read(m.weights["w"]), ExternalDataError, "FIFO")
    assert err.tensor == "w"


def test_data_file_that_is_a_fifo_at_load_is_refused(tmp_path):
    write_model(tmp_path, [Spec("w", V)])
    os.unlink(tmp_path / "weights.bin")
    os.mkfifo(tmp_path / "weights.bin")
    _raises(lambda: load_model(tmp_path / "model.onnx"), ExternalDataError, "not a regular file")


def test_data_file_swapped_for_a_symlink_after_load_is_refused(tmp_path):
    m = load_model(write_model(tmp_path, [Spec("w", V)]))
    data = m.weights["w"].payload.file
    os.rename(data, tmp_path / "real.bin")
    os.symlink(tmp_path / "real.bin", data)
    _raises(lambda: ExternalDataReader().read(m.weights["w"]), ExternalDataError, "cannot open")


def test_open_regular_refuses_specials(tmp_path):
    os.mkfifo(tmp_path / "f")
    for p in (tmp_path / "f", "/dev/zero", tmp_path):
        _, err = bounded(lambda p=p: open_regular(str(p)))
        assert isinstance(err, OSError)


def _companion(tmp_path):
    from onnx_prepared.prepared.cache import PreparedModelStore
    from onnx_prepared.resolve.keys import PreparedKey

    path = tmp_path / "c" / "m.prepared.onnx"
    s = PreparedModelStore(path, source_digest="a" * 64, policy="build_if_missing")
    k = PreparedKey(("W",), "gemm-b-kn", "cpu", "b" * 64)
    s.put(k, np.arange(100, dtype=np.uint8))
    s.flush()
    s.close()
    return path, k


def test_companion_manifest_fifo_is_a_cache_error(tmp_path):
    from onnx_prepared.prepared.cache import PreparedModelStore

    path = tmp_path / "m.prepared.onnx"
    os.mkfifo(path)
    _raises(lambda: PreparedModelStore(path, source_digest="a" * 64, policy="read_only"), CacheError, "FIFO")


def test_companion_manifest_symlinked_to_dev_zero_is_a_cache_error(tmp_path):
    from onnx_prepared.prepared.cache import PreparedModelStore

    path = tmp_path / "m.prepared.onnx"
    os.symlink("/dev/zero", path)
    _raises(lambda: PreparedModelStore(path, source_digest="a" * 64, policy="read_only"), CacheError,
            "character device")


def test_companion_payload_fifo_invalidates_its_entry_without_blocking(tmp_path):
    from onnx_prepared.prepared.cache import PreparedModelStore

    path, k = _companion(tmp_path)
    data = next(p for p in path.parent.iterdir() if p.name.endswith(".data"))
    os.unlink(data)
    os.mkfifo(data)
    store, err = bounded(lambda: PreparedModelStore(path, source_digest="a" * 64, policy="read_only"))
    assert err is None
    assert store.lookup(k) is None and "FIFO" in store.explain_miss(k)


# ---- sizes and memory -----------------------------------------------------------------------------


def _sparse_model(tmp_path, nbytes: int) -> str:
    with open(tmp_path / "huge.bin", "wb") as f:
        f.truncate(nbytes)  # sparse: no disk used
    t = TensorProto(name="huge", data_type=TensorProto.UINT8, dims=[nbytes], data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "huge.bin"), ("offset", "0"), ("length", str(nbytes))):
        t.external_data.add(key=k, value=v)
    out = helper.make_tensor_value_info("y", TensorProto.UINT8, [nbytes])
    g = helper.make_graph([helper.make_node("Identity", ["huge"], ["y"])], "g", [], [out], [t])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def test_tensor_larger_than_physical_memory_is_refused_before_allocation(tmp_path):
    m = load_model(_sparse_model(tmp_path, 10**12))
    err = _raises(lambda: ExternalDataReader().read(m.weights["huge"]), ResourceLimitError, "1000000000000 bytes")
    assert "huge" in str(err) and "physical memory" in str(err)


@pytest.mark.parametrize("option, size", [("memory_limit", 3 << 30), ("prepared_memory_limit", 10**12)])
def test_tensor_larger_than_a_memory_limit_is_refused_naming_it(tmp_path, option, size):
    """memory_limit is a hard cap per tensor; prepared_memory_limit is a residency target one object may
    exceed alone (the residency tests rely on it), so only physical memory bounds it."""
    from onnx_prepared import RuntimeSession, SessionOptions

    path = _sparse_model(tmp_path, size)
    so = SessionOptions()
    setattr(so, option, 1 << 30)

    def run():
        with RuntimeSession(path, so) as s:
            return s.run({})

    err = _raises(run, OnnxPreparedError)
    assert isinstance(err, MemoryError) and "huge" in str(err) and str(size) in str(err)


def test_huge_digit_strings_are_our_error(tmp_path):
    for key in ("length", "offset"):
        path = write_model(tmp_path, [Spec("w", V, entries={key: "9" * 5000})])
        err = _raises(lambda path=path: load_model(path), ExternalDataError, "digits")
        assert len(str(err)) < 1000


# ---- descriptors ----------------------------------------------------------------------------------


def test_fd_pool_is_bounded_and_reuses_lru(tmp_path):
    paths = []
    for i in range(20):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x")
        paths.append(str(p))
    pool = FdPool(lambda p: open_regular(p, follow=False)[0], bound=4)
    held = pool.acquire(paths[0])  # in use: evicted but not closed under its reader
    for p in paths[1:]:
        pool.release(pool.acquire(p))
    assert len(pool) == 4
    assert os.pread(held, 1, 0) == b"x"
    pool.release(held)
    with pytest.raises(OSError):
        os.fstat(held)  # closed at its last release
    pool.close()


def test_a_pool_asks_its_default_bound_at_first_use(monkeypatch, tmp_path):
    """A session's reader builds an FdPool even when the model has no data file: the default bound (a
    getrlimit) is asked when the pool is first used, once."""
    from onnx_prepared.model import safe_open

    asked = []
    monkeypatch.setattr(safe_open, "default_fd_bound", lambda: asked.append(1) or 8)
    pool = FdPool(lambda p: open_regular(p, follow=False)[0])
    assert asked == []
    p = tmp_path / "f"
    p.write_bytes(b"x")
    pool.release(pool.acquire(str(p)))
    assert pool.bound == 8 and asked == [1]
    pool.close()
    assert FdPool(lambda p: 0, bound=3).bound == 3 and asked == [1]


def test_five_thousand_external_files_under_ulimit_1024(tmp_path):
    n = 5000
    inits = []
    for i in range(n):
        t = numpy_helper.from_array(np.full(2, i, np.float32), f"w{i}")
        (tmp_path / f"w{i}.bin").write_bytes(t.raw_data)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=f"w{i}.bin")
        inits.append(t)
    node = helper.make_node("Concat", [f"w{i}" for i in range(n)], ["y"], axis=0)
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2 * n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "m.onnx")
    code = textwrap.dedent(f"""
        import resource, numpy as np
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from onnx_prepared import RuntimeSession
        with RuntimeSession({str(tmp_path / "m.onnx")!r}) as s:
            (y,) = s.run({{}})
        assert np.array_equal(y, np.repeat(np.arange({n}, dtype=np.float32), 2)), y[:10]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=os.getcwd())
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


# ---- versions, nesting, message bounds --------------------------------------------------------------


def _tiny(opset=21, ir=None, op="Relu", domain="") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain)], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(domain, opset)])
    if ir is not None:
        m.ir_version = ir
    return m


@pytest.mark.parametrize("model, match", [
    (_tiny(opset=99), "opset 99"),
    (_tiny(ir=99), "IR version 99"),
    (_tiny(opset=13, op="Gelu"), "first appears in opset 20"),
    (_tiny(opset=9, op="Relu", domain="ai.onnx.ml"), "opset 9 of domain 'ai.onnx.ml'"),
])
def test_versions_beyond_the_installed_onnx_are_refused(tmp_path, model, match):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    _raises(lambda: load_model(path), ModelLoadError, match)


def _ld(field: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (built by hand: protobuf itself recurses on deep messages)."""
    n, size = len(payload), b""
    while True:
        b = n & 0x7F
        n >>= 7
        size += bytes([b | (0x80 if n else 0)])
        if not n:
            break
    return bytes([(field << 3) | 2]) + size + payload


def _nested_if_bytes(depth: int) -> bytes:
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]).SerializeToString()
    leaf = helper.make_graph([helper.make_node("Constant", [], ["y"], value_float=1.0)], "leaf", [],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    body = leaf_bytes = leaf.SerializeToString()
    for _ in range(depth):  # then_branch nests, else_branch is the leaf (size stays linear)
        # AttributeProto: name (1), type (20, varint tag 0xA0 0x01) = GRAPH (5), g (6)
        attrs = b"".join(_ld(5, _ld(1, name.encode()) + bytes([0xA0, 0x01, 5]) + _ld(6, g))
                         for name, g in (("then_branch", body), ("else_branch", leaf_bytes)))
        node = _ld(1, b"c") + _ld(2, b"y") + _ld(4, b"If") + attrs
        body = _ld(1, node) + _ld(2, b"g") + _ld(12, out)
    model = helper.make_model(helper.make_graph([], "x", [], []), opset_imports=[helper.make_opsetid("", 21)])
    model.ClearField("graph")
    return model.SerializeToString() + _ld(7, body)


def test_nesting_depth_is_reported_as_such(tmp_path):
    shallow = tmp_path / "ok.onnx"
    shallow.write_bytes(_nested_if_bytes(3))
    assert load_model(shallow).graph.node[0].op_type == "If"  # the hand-built encoding is valid
    path = tmp_path / "m.onnx"
    path.write_bytes(_nested_if_bytes(200))
    err = _raises(lambda: load_model(path), ModelLoadError, "nests subgraphs 201 levels deep")
    assert "malformed" not in str(err)


def test_truncated_protobuf_is_still_malformed(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_nested_if_bytes(3)[:-7])
    _raises(lambda: load_model(path), ModelLoadError, "malformed")


def test_ten_megabyte_node_name_gives_a_bounded_message(tmp_path):
    from onnx_prepared import RuntimeSession

    m = _tiny(op="NoSuchOp", domain="example.custom", opset=1)
    m.graph.node[0].name = "n" * (10 << 20)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    err = _raises(lambda: RuntimeSession(path), UnsupportedOpError)
    assert len(str(err)) <= 2100


def test_every_error_message_is_bounded():
    assert len(str(ModelLoadError("x" * 10**7))) <= 2000
    assert len(str(ExternalDataError("bad", tensor="t" * 10**6, file="f" * 10**6))) <= 2000
