"""Subgraph nesting depth read straight from the protobuf wire format, for models protobuf refuses.

protobuf stops parsing at 100 nested messages; an ``If`` inside an ``If`` costs three (graph, node,
attribute), so about 33 levels already make ``ParseFromString`` fail with a bare decode error. When
that happens, :func:`graph_depth` walks the bytes (iteratively, no recursion) so the load error can
say "nesting depth" instead of "malformed protobuf".
"""

from __future__ import annotations

# (message kind, field number) -> kind of the nested message; only the path to subgraphs.
_CHILDREN = {
    ("model", 7): "graph",  # ModelProto.graph
    ("model", 25): "function",  # ModelProto.functions
    ("graph", 1): "node",  # GraphProto.node
    ("function", 7): "node",  # FunctionProto.node
    ("node", 5): "attribute",  # NodeProto.attribute
    ("attribute", 6): "graph",  # AttributeProto.g
    ("attribute", 11): "graph",  # AttributeProto.graphs
}


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def graph_depth(data: bytes) -> int | None:
    """Deepest graph nesting (the main graph is 1), or None if the bytes are not walkable protobuf."""
    deepest = 0
    stack = [("model", 0, len(data), 0)]  # (kind, pos, end, graph depth)
    try:
        while stack:
            kind, pos, end, depth = stack.pop()
            while pos < end:
                tag, pos = _varint(data, pos, end)
                field, wire = tag >> 3, tag & 7
                if wire == 0:
                    _, pos = _varint(data, pos, end)
                elif wire == 1:
                    pos += 8
                elif wire == 5:
                    pos += 4
                elif wire == 2:
                    n, pos = _varint(data, pos, end)
                    if pos + n > end:
                        return None
                    child = _CHILDREN.get((kind, field))
                    if child is not None:
                        d = depth + (child == "graph")
                        deepest = max(deepest, d)
                        stack.append((child, pos, pos + n, d))
                    pos += n
                else:
                    return None
                if pos > end:
                    return None
    except ValueError:
        return None
    return deepest
