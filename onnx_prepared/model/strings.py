"""Find string fields that protobuf could not decode as UTF-8.

ONNX is proto2, so the parser accepts invalid UTF-8 in ``string`` fields and hands the value back as
``bytes``. Such a value then reaches code that expects ``str`` (names, op types, external-data entries,
metadata) and fails there with a foreign ``TypeError``/``ValueError``, far from the file. Both parse
choke points (the model loader and the companion index parser) walk the parsed message once with
:func:`invalid_string_field` and refuse the file naming the field, so no later code sees ``bytes``.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["invalid_string_field"]

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _repeated(fd: FieldDescriptor) -> bool:
    r = getattr(fd, "is_repeated", None)  # protobuf >= 6; older ones only have ``label``
    return bool(r) if r is not None else fd.label == FieldDescriptor.LABEL_REPEATED


def invalid_string_field(message: Message, root: str = "model") -> str | None:
    """The path (``model.graph.node[3].name``) of the first string field holding undecodable bytes, or
    None. Iterative (subgraphs nest arbitrarily deep); visits only the fields that are set, and skips
    bytes and numeric fields, so bulk tensor data costs nothing."""
    stack: list[tuple[Message, str]] = [(message, root)]
    while stack:
        msg, path = stack.pop()
        for fd, value in msg.ListFields():
            if fd.type == _STRING:
                if _repeated(fd):
                    for i, v in enumerate(value):
                        if not isinstance(v, str):
                            return f"{path}.{fd.name}[{i}]"
                elif not isinstance(value, str):
                    return f"{path}.{fd.name}"
            elif fd.type == _MESSAGE:
                if _repeated(fd):
                    stack.extend((v, f"{path}.{fd.name}[{i}]") for i, v in enumerate(value))
                else:
                    stack.append((value, f"{path}.{fd.name}"))
    return None
