"""Node attributes as Python values, parsed once at binding (the hot path never reads a protobuf)."""

from __future__ import annotations

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ModelLoadError


def parse_attributes(node: onnx.NodeProto) -> dict | None:
    """ONNX attributes as Python values; tensors become ndarrays, graphs stay GraphProtos.

    None when an attribute references the enclosing function's attributes (``ref_attr_name``): only
    the reference fallback can resolve those, per call.
    """
    attrs = {}
    for a in node.attribute:
        t = a.type
        get = _PLAIN.get(t)
        if get is not None:  # the common kinds, read directly (ref_attr_name is only set with a type too)
            if a.ref_attr_name:
                return None
            attrs[a.name] = get(a)
            continue
        if a.ref_attr_name:
            return None
        v = onnx.get_attribute_value(a)
        if t == onnx.AttributeProto.TENSOR:
            try:
                v = onnx.to_array(v)
            except ModelLoadError as e:
                raise ModelLoadError(f"node {node.name or node.op_type!r} ({node.op_type}): attribute {a.name!r}: "
                                     f"{e}") from None
        elif t == onnx.AttributeProto.STRING or t == onnx.AttributeProto.STRINGS:
            try:
                v = v.decode("utf-8") if t == onnx.AttributeProto.STRING else [s.decode("utf-8") for s in v]
            except UnicodeDecodeError:  # onnxruntime refuses it too (an invalid string attribute)
                raise ModelLoadError(f"node {node.name or node.op_type!r} ({node.op_type}): attribute {a.name!r} "
                                     f"is not valid UTF-8") from None
        attrs[a.name] = v
    return attrs


_A = onnx.AttributeProto
#: attribute type -> its value as parse_attributes returns it, for the kinds that need no conversion
_PLAIN = {_A.INT: lambda a: a.i, _A.FLOAT: lambda a: a.f, _A.INTS: lambda a: list(a.ints),
          _A.FLOATS: lambda a: list(a.floats)}
