"""model/wire.py: the initializers' raw_data lengths and the model's bytes without them, read from the wire
format as the parser reads it (merged graph occurrences, the last raw_data wins), and the loader's use of
it: no payload copied to be measured, and hostile files still refused with the package's errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ModelLoadError
from onnx_prepared.model import load_model, loader
from onnx_prepared.model.wire import scan_initializers


def _expected(data: bytes) -> tuple[list[int | None], onnx.ModelProto]:
    m = onnx.ModelProto()
    m.ParseFromString(data)
    lengths = [len(t.raw_data) if t.HasField("raw_data") else None for t in m.graph.initializer]
    for t in m.graph.initializer:
        t.ClearField("raw_data")
    return lengths, m


def _check(data: bytes) -> None:
    got = scan_initializers(data)
    assert got is not None
    lengths, stripped = got
    want_lengths, want_model = _expected(data)
    assert lengths == want_lengths
    m = onnx.ModelProto()
    m.ParseFromString(stripped)
    assert m == want_model


def _model(n_weights: int = 3, size: int = 300) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(size + i).astype(np.float32), f"w{i}")
             for i in range(n_weights)]
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.0, 2.0]))  # float_data, no raw_data
    inits.append(helper.make_tensor("empty", TensorProto.FLOAT, [0], b"", raw=True))  # raw_data of 0 bytes
    nodes = [helper.make_node("Identity", ["x"], ["y"], name="n\u00e9")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_lengths_and_stripped_bytes_match_the_parser():
    _check(_model().SerializeToString())


def test_merged_graph_occurrences_and_a_repeated_raw_data_field():
    data = _model().SerializeToString()
    extra = onnx.ModelProto()
    extra.graph.initializer.add(name="late", data_type=TensorProto.UINT8, dims=[3], raw_data=b"abc")
    # the same tensor's raw_data written twice: the parser keeps the last
    t = extra.graph.initializer[0]
    twice = t.SerializeToString() + bytes([0x4A, 5]) + b"12345"
    tail = bytes([0x3A]) + _varint(len(twice) + 2) + bytes([0x2A, len(twice)]) + twice
    _check(data + extra.SerializeToString() + tail)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_group_wire_type_and_truncation_are_not_followed():
    data = _model().SerializeToString()
    assert scan_initializers(data + bytes([0x0B, 0x0C])) is None  # a group (field 1, wire type 3) at the top
    assert scan_initializers(data[:-3]) is None  # a length past the end


def test_loader_measures_no_payload_by_copying(tmp_path, monkeypatch):
    m = _model(n_weights=2, size=400_000)  # large enough for the wire scan to pay (loader._inline_weights)
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString())
    calls = []
    real = loader.scan_initializers
    monkeypatch.setattr(loader, "scan_initializers", lambda data: calls.append(len(data)) or real(data))
    loaded = load_model(str(p))
    assert calls
    assert [d.nbytes for d in loaded.weights.values()] == [1_600_000, 1_600_004, 8, 0]
    assert loaded.weights["w1"].payload.tensor.raw_data == m.graph.initializer[1].raw_data


def test_loader_still_refuses_bad_raw_data_length_and_bad_utf8(tmp_path):
    m = _model(n_weights=1, size=400_000)
    m.graph.initializer[0].dims[0] = 399_999  # raw_data holds 4 bytes more than the dims say
    p = tmp_path / "bad_len.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelLoadError, match="raw_data holds 1600000 bytes"):
        load_model(str(p))
    m = _model(n_weights=1, size=400_000)
    data = m.SerializeToString().replace("n\u00e9".encode(), b"n\xff\xfe", 1)  # nodes precede initializers
    p = tmp_path / "bad_utf8.onnx"
    p.write_bytes(data)
    with pytest.raises(ModelLoadError, match="not valid UTF-8"):
        load_model(str(p))
