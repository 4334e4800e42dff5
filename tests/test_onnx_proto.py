"""onnx_prepared.onnx_proto's stand-ins give what onnx.helper / numpy_helper give."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from onnx_prepared import onnx_proto


def test_same_classes_as_onnx():
    assert onnx_proto.ModelProto is onnx.ModelProto
    assert onnx_proto.NodeProto is onnx.NodeProto
    assert onnx_proto.IR_VERSION == onnx.IR_VERSION
    assert onnx_proto.defs.onnx_opset_version() == onnx.defs.onnx_opset_version()
    assert onnx_proto.defs.onnx_ml_opset_version() == onnx.defs.onnx_ml_opset_version()
    assert onnx_proto.numpy_helper is numpy_helper  # other names come from the real package


@pytest.mark.parametrize("elem", [v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED])
def test_dtype_maps(elem):
    want = helper.tensor_dtype_to_np_dtype(elem)
    assert onnx_proto.tensor_dtype_to_np_dtype(elem) == want
    assert onnx_proto.np_dtype_to_tensor_dtype(want) == helper.np_dtype_to_tensor_dtype(want)


def test_attribute_values():
    g = helper.make_graph([], "g", [], [])
    t = numpy_helper.from_array(np.arange(3, dtype=np.int64), "t")
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT, [2])
    node = helper.make_node("X", [], [], f=1.5, i=3, s="abc", t=t, g=g, floats=[1.0, 2.0], ints=[1, 2],
                            strings=["a", "b"], tensors=[t], graphs=[g], tp=tp, tps=[tp])
    for a in node.attribute:
        assert onnx_proto.get_attribute_value(a) == helper.get_attribute_value(a), a.name
    ref = AttributeProto(name="r", ref_attr_name="outer", type=AttributeProto.INT)
    with pytest.raises(ValueError):
        onnx_proto.get_attribute_value(ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16,
                                   np.int32, np.int64, np.uint32, np.uint64, np.bool_, np.complex64])
def test_to_array_raw(dtype):
    a = (np.arange(12).reshape(3, 4) % 5).astype(dtype)
    t = numpy_helper.from_array(a, "a")
    got = onnx_proto.to_array(t)
    assert got.dtype == numpy_helper.to_array(t).dtype and got.shape == (3, 4)
    np.testing.assert_array_equal(got, a)


def test_to_array_other_encodings():
    typed = [helper.make_tensor(f"t{e}", e, [2, 2], [1, 0, 3, 2]) for e in (
        TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT8, TensorProto.UINT8,
        TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64, TensorProto.INT16, TensorProto.FLOAT16,
        TensorProto.BOOL)]
    typed.append(helper.make_tensor("neg", TensorProto.INT8, [3], [-128, -1, 127]))
    typed.append(helper.make_tensor("scalar", TensorProto.INT64, [], [7]))
    for t in (*typed, helper.make_tensor("f", TensorProto.FLOAT, [2], [1.0, 2.0]),
              helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"b"]),
              helper.make_tensor("i4", TensorProto.INT4, [3], [1, -2, 3]),
              helper.make_tensor("e", TensorProto.FLOAT, [0], [])):
        got, want = onnx_proto.to_array(t), numpy_helper.to_array(t)
        assert got.dtype == want.dtype and got.shape == want.shape, t.name
        np.testing.assert_array_equal(got, want)
