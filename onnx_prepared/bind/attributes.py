"""Node attributes as Python values, parsed once at binding (the hot path never reads a protobuf)."""

from __future__ import annotations

from onnx_prepared import onnx_proto as onnx


def parse_attributes(node: onnx.NodeProto) -> dict | None:
    """ONNX attributes as Python values; tensors become ndarrays, graphs stay GraphProtos.

    None when an attribute references the enclosing function's attributes (``ref_attr_name``): only
    the reference fallback can resolve those, per call.
    """
    attrs = {}
    for a in node.attribute:
        if a.ref_attr_name:
            return None
        v = onnx.get_attribute_value(a)
        if a.type == onnx.AttributeProto.TENSOR:
            v = onnx.to_array(v)
        elif a.type == onnx.AttributeProto.STRING:
            v = v.decode("utf-8")
        elif a.type == onnx.AttributeProto.STRINGS:
            v = [s.decode("utf-8") for s in v]
        attrs[a.name] = v
    return attrs
