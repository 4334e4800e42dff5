"""load_model: metadata only, every initializer described, clean errors for bad model files."""

from __future__ import annotations

import builtins
import hashlib
import io
import mmap
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_prepared.errors import ExternalDataError, ModelLoadError
from onnx_prepared.model import (
    ExternalDataReader,
    ExternalPayload,
    InlinePayload,
    describe_model,
    inline_nested_external,
    load_model,
    load_model_bytes,
    reader_map,
)
from tests.model.model_builders import Spec, write_model


def _assert_clean(excinfo, *needles: str) -> None:
    """The error names what it is about and hides the protobuf/numpy/OS exception underneath."""
    msg = str(excinfo.value)
    for n in needles:
        assert n in msg, (n, msg)
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__suppress_context__ or excinfo.value.__context__ is None


def test_describes_every_initializer(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1, -2, 3], dtype=np.int64)
    c = np.array(7.5, dtype=np.float64)
    path = write_model(tmp_path, [Spec("a", a), Spec("b", b, external=False), Spec("c", c)], align=4096)
    m = load_model(path)
    assert m.path == path and m.base_dir == str(tmp_path)
    assert list(m.weights) == ["a", "b", "c"]  # graph order
    wa, wb, wc = m.weights["a"], m.weights["b"], m.weights["c"]
    assert (wa.elem_type, wa.dims, wa.dtype, wa.numel, wa.nbytes) == (onnx.TensorProto.FLOAT, (3, 4),
                                                                      np.float32, 12, 48)
    assert wa.payload == ExternalPayload(str(tmp_path / "weights.bin"), 0, 48, None)
    assert wc.payload == ExternalPayload(str(tmp_path / "weights.bin"), 4096, 8, None)
    assert wc.dims == () and wc.numel == 1 and wc.is_external
    assert isinstance(wb.payload, InlinePayload) and not wb.is_external and wb.nbytes == 24
    assert m.opsets == {"": 21} and m.functions == {} and m.graph is m.model.graph
    with pytest.raises(TypeError):
        m.weights["x"] = wa  # read-only mapping


def test_load_opens_no_data_file(tmp_path, monkeypatch):
    """No weight byte is read at load: the data file is never opened, mapped or pread."""
    path = write_model(tmp_path, [Spec("w", np.ones((64, 64), np.float32)), Spec("v", np.zeros(5, np.int8))])
    data = os.path.realpath(tmp_path / "weights.bin")

    def guard(real):
        def wrapped(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(file) == data:
                raise AssertionError(f"data file opened during load: {file}")
            return real(file, *args, **kwargs)
        return wrapped

    def no_read(*args, **kwargs):
        raise AssertionError("weight bytes read during load")

    monkeypatch.setattr(builtins, "open", guard(builtins.open))
    monkeypatch.setattr(io, "open", guard(io.open))
    monkeypatch.setattr(os, "open", guard(os.open))
    monkeypatch.setattr(os, "preadv", no_read)
    monkeypatch.setattr(os, "pread", no_read)
    monkeypatch.setattr(mmap, "mmap", no_read)
    monkeypatch.setattr(reader_map, "_calls", no_read)
    monkeypatch.setattr(ExternalDataReader, "read_bytes", no_read)
    monkeypatch.setattr(hashlib, "sha256", no_read)  # no checksum computed at load either
    m = load_model(path)
    assert m.weights["w"].payload.length == 64 * 64 * 4
    monkeypatch.undo()
    with ExternalDataReader() as r:
        np.testing.assert_array_equal(r.read(m.weights["w"]), np.ones((64, 64), np.float32))


@pytest.mark.parametrize("one_file", [True, False])
def test_matches_onnx_external_data_save(tmp_path, one_file):
    """Models written by onnx's own external-data saver load and read back the same values."""
    rng = np.random.default_rng(0)
    vals = {f"w{i}": rng.standard_normal((i + 1, 7)).astype(np.float32) for i in range(5)}
    vals["i"] = np.arange(10, dtype=np.int64)
    inits = [numpy_helper.from_array(v, k) for k, v in vals.items()]
    outs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in vals.items()]
    model = helper.make_model(helper.make_graph([], "g", [], outs, initializer=inits))
    path = str(tmp_path / "m.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=one_file,
                    location="data.bin" if one_file else None, size_threshold=0)
    m = load_model(path)
    assert all(w.is_external for w in m.weights.values())
    assert len({w.payload.file for w in m.weights.values()}) == (1 if one_file else len(vals))
    with ExternalDataReader() as r:
        for k, v in vals.items():
            np.testing.assert_array_equal(r.read(m.weights[k]), v)


def test_load_from_bytes_and_proto(tmp_path):
    """In-memory models: external data resolves in the given folder, with the same validation."""
    v = np.arange(5, dtype=np.int32)
    path = write_model(tmp_path, [Spec("w", v)])
    with open(path, "rb") as f:
        blob = f.read()
    m = load_model_bytes(blob, tmp_path)
    assert m.path == "<memory>" and m.base_dir == str(tmp_path)
    np.testing.assert_array_equal(ExternalDataReader().read(m.weights["w"]), v)
    m2 = describe_model(onnx.load_from_string(blob), tmp_path, path="mine")
    assert m2.path == "mine" and m2.weights["w"].payload == m.weights["w"].payload
    with pytest.raises(ExternalDataError, match="external data file is missing"):
        load_model_bytes(blob, tmp_path / "elsewhere")
    with pytest.raises(ModelLoadError) as ei:
        load_model_bytes(blob[:-3], tmp_path)
    _assert_clean(ei, "<memory>")


# ---- bad model files ----------------------------------------------------------------------------


def test_missing_model_file(tmp_path):
    p = str(tmp_path / "nope.onnx")
    with pytest.raises(ModelLoadError) as ei:
        load_model(p)
    _assert_clean(ei, p, "model file not found")


def test_directory_instead_of_model_file(tmp_path):
    with pytest.raises(ModelLoadError) as ei:
        load_model(tmp_path)
    _assert_clean(ei, str(tmp_path), "model path is a directory")


def test_empty_model_file(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelLoadError) as ei:
        load_model(p)
    _assert_clean(ei, str(p), "model file is empty")


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes(tmp_path, seed):
    p = tmp_path / "junk.onnx"
    p.write_bytes(np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ModelLoadError) as ei:
        load_model(p)
    _assert_clean(ei, str(p))
    assert type(ei.value) is ModelLoadError


def test_truncated_model_every_cut(tmp_path):
    """Every strict prefix of a model file fails cleanly (the cut right after the graph included)."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32), "w")
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [6])],
                          [helper.make_tensor_value_info("y", 1, [6])], initializer=[w])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    p = tmp_path / "cut.onnx"
    for cut in range(len(blob)):
        p.write_bytes(blob[:cut])
        with pytest.raises(ModelLoadError) as ei:
            load_model(p)
        _assert_clean(ei, str(p))
    p.write_bytes(blob)
    assert load_model(p).weights["w"].dims == (6,)


def test_no_graph(tmp_path):
    p = tmp_path / "nograph.onnx"
    p.write_bytes(onnx.ModelProto(ir_version=9, producer_name="x").SerializeToString())
    with pytest.raises(ModelLoadError, match="no graph"):
        load_model(p)


def test_duplicate_initializer(tmp_path):
    path = write_model(tmp_path, [Spec("w", np.ones(2, np.float32), external=False)])
    m = onnx.load(path)
    m.graph.initializer.append(m.graph.initializer[0])
    onnx.save(m, path)
    with pytest.raises(ModelLoadError, match="duplicate initializer 'w'"):
        load_model(path)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: setattr(t, "raw_data", t.raw_data[:-1]), "raw_data holds 7 bytes"),
        (lambda t: setattr(t, "data_type", 999), "unknown element type 999"),
        (lambda t: setattr(t, "data_type", 0), "UNDEFINED"),
        (lambda t: t.dims.__setitem__(0, -2), "negative dimension"),
        (lambda t: t.segment.__setattr__("begin", 0), "segments"),
    ],
)
def test_bad_inline_tensor(tmp_path, mutate, needle):
    path = write_model(tmp_path, [Spec("w", np.ones(2, np.float32), external=False)])
    m = onnx.load(path)
    mutate(m.graph.initializer[0])
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    with pytest.raises(ModelLoadError) as ei:
        load_model(path)
    _assert_clean(ei, "'w'", path, needle)


def test_inline_typed_field_that_does_not_decode(tmp_path):
    """A typed-field tensor with too few values loads (no decode at load) and fails cleanly at read."""
    t = helper.make_tensor("w", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    del t.float_data[-1]
    g = helper.make_graph([], "g", [], [helper.make_tensor_value_info("w", 1, [3])], initializer=[t])
    p = tmp_path / "m.onnx"
    p.write_bytes(helper.make_model(g).SerializeToString())
    m = load_model(p)
    with pytest.raises(ModelLoadError) as ei:
        ExternalDataReader().read(m.weights["w"])
    _assert_clean(ei, "'w'")


# ---- external tensors outside graph.initializer --------------------------------------------------


def _model_with_nested(tmp_path) -> tuple[str, np.ndarray, np.ndarray]:
    then_w = np.arange(16, dtype=np.float32)
    const = np.full(16, 2.0, np.float32)
    then_g = helper.make_graph([helper.make_node("Identity", ["tw"], ["o"])], "then", [],
                               [helper.make_tensor_value_info("o", 1, [16])],
                               initializer=[numpy_helper.from_array(then_w, "tw")])
    else_g = helper.make_graph([helper.make_node("Constant", [], ["o2"], value=numpy_helper.from_array(const))],
                               "else", [], [helper.make_tensor_value_info("o2", 1, [16])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if0")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", 1, [16])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    path = str(tmp_path / "nested.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location="nested.bin", size_threshold=0,
                    convert_attribute=True)
    return path, then_w, const


def test_nested_external_tensors_are_described_and_inlined(tmp_path):
    from onnx.reference import ReferenceEvaluator

    path, then_w, const = _model_with_nested(tmp_path)
    m = load_model(path)
    assert m.weights == {}
    assert len(m.nested_external) == 2
    assert {n.desc.nbytes for n in m.nested_external} == {64}
    assert any("then_branch" in n.where for n in m.nested_external)
    assert any("else_branch" in n.where and "value" in n.where for n in m.nested_external)
    with ExternalDataReader() as r:
        assert inline_nested_external(m, r) == 2
        assert r.bytes_read == 128
        assert inline_nested_external(m, r) == 0  # idempotent
    ev = ReferenceEvaluator(m.model)
    np.testing.assert_array_equal(ev.run(None, {"c": np.array(True)})[0], then_w)
    np.testing.assert_array_equal(ev.run(None, {"c": np.array(False)})[0], const)


def test_nested_external_escape_is_rejected(tmp_path):
    path, _, _ = _model_with_nested(tmp_path)
    m = onnx.load(path, load_external_data=False)
    then_g = next(a.g for a in m.graph.node[0].attribute if a.name == "then_branch")
    then_init = then_g.initializer[0]
    for e in then_init.external_data:
        if e.key == "location":
            e.value = "../nested.bin"
    onnx.save(m, path)
    with pytest.raises(ExternalDataError) as ei:
        load_model(path)
    _assert_clean(ei, "'tw'", "../nested.bin", "escapes")
