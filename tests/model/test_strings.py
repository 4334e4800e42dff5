"""model/strings.py: the proto3 twin that validates UTF-8 while parsing, and the walk it stands in for."""

from __future__ import annotations

import pytest

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.model import strings

upb = pytest.importorskip("google._upb._message")

# producer_name (ModelProto field 2) holding each sequence; strict UTF-8 refuses the first six
BAD = [b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\xff"]
GOOD = [b"\xef\xbf\xbf", b"\xf0\x9f\x98\x80", b"a\x00b", b"", "\u00e9t\u00e9".encode()]


def _model(value: bytes) -> tuple[onnx.ModelProto, bytes]:
    data = bytes([0x12, len(value)]) + value
    m = onnx.ModelProto()
    m.ParseFromString(data)
    return m, data


@pytest.mark.parametrize("value", BAD + GOOD)
def test_twin_agrees_with_the_walk(value):
    m, data = _model(value)
    walked = strings.invalid_string_field(m)  # no bytes: the walk alone
    assert walked == (None if value in GOOD else "model.producer_name")
    assert strings.invalid_string_field(m, data=data) == walked
    assert strings._strings_verified(m, data) is (walked is None)


def test_the_walk_does_not_run_when_the_twin_validates(monkeypatch):
    m = onnx.ModelProto(producer_name="p", doc_string="d")
    m.graph.node.add(name="n", op_type="Relu", input=["x"], output=["y"])
    data = m.SerializeToString()
    calls = []
    real = strings._KIND.get

    class Spy(dict):
        def get(self, k, d=None):
            calls.append(k)
            return real(k, d)

    monkeypatch.setattr(strings, "_KIND", Spy(strings._KIND))
    assert strings.invalid_string_field(m, data=data) is None
    assert calls == []
    m.graph.node[0].name = "\u00e9"
    bad = m.SerializeToString().replace("\u00e9".encode(), b"\xff\xfe")
    m2 = onnx.ModelProto()
    m2.ParseFromString(bad)
    assert strings.invalid_string_field(m2, data=bad) == "model.graph.node[0].name"
    assert calls  # refused by the twin: the walk names the field


def test_twin_is_a_proto3_copy_in_a_pool_of_its_own():
    cls = strings._twin(onnx.ModelProto())
    assert cls is not None and cls is not onnx.ModelProto
    assert cls.DESCRIPTOR.full_name == "onnx.ModelProto"
    # the package's own class still hands invalid UTF-8 back as bytes (proto2): nothing changed there
    m, _ = _model(b"\xff")
    assert m.producer_name == b"\xff"
