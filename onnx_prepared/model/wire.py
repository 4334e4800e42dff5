"""Where the inline weights of a serialized ModelProto lie, read from the wire format, not parsed.

Why: protobuf hands a ``bytes`` field back as a fresh copy, so asking ``len(t.raw_data)`` of every
initializer copied every inline weight (resnet18: 45 MB, ~7 ms), and the UTF-8 check's second parse
(:mod:`onnx_prepared.model.strings`) copied them once more (~20 ms). :func:`scan_initializers` gives the
loader, from the bytes the parser already accepted, the length of each top-level initializer's
``raw_data`` and the model's bytes without those fields. ``raw_data`` is a ``bytes`` field, so the
UTF-8 verdict on the stripped bytes is the verdict on the model.

Anything it does not follow (a group wire type, a known field under another wire type, a length past
the end) gives None, and the caller takes the copying path.
"""

from __future__ import annotations

from onnx_prepared import onnx_proto as onnx

_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_LEN = 2  # wire type of length-delimited fields


class _Unfollowed(Exception):
    pass


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Unfollowed
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _fields(data: bytes, pos: int, end: int):
    """(field start, number, wire type, value start, value end) of each field of ``data[pos:end]``."""
    while pos < end:
        start = pos
        key = data[pos]  # one-byte varints inline: field numbers below 16, dims and lengths below 128
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos, end)
        wire = key & 7
        if wire == 0:
            vs = pos
            if pos < end and data[pos] < 0x80:
                ve = pos + 1
            else:
                _, ve = _varint(data, pos, end)
        elif wire == 2:
            if pos < end and data[pos] < 0x80:
                vs = pos + 1
                ve = vs + data[pos]
            else:
                n, vs = _varint(data, pos, end)
                ve = vs + n
        elif wire == 1:
            vs, ve = pos, pos + 8
        elif wire == 5:
            vs, ve = pos, pos + 4
        else:  # groups (3, 4) and undefined wire types
            raise _Unfollowed
        if ve > end:
            raise _Unfollowed
        yield start, key >> 3, wire, vs, ve
        pos = ve


def _field(number: int, body: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(body)) + body


def scan_initializers(data: bytes) -> tuple[list[int | None], bytes] | None:
    """``(raw_data length per graph.initializer, None where the field is absent; data without them)``,
    in the order protobuf parses them (every ``graph`` occurrence, merged), or None (module docstring)."""
    try:
        lengths: list[int | None] = []
        out: list[bytes] = []
        prev = 0
        for start, num, wire, vs, ve in _fields(data, 0, len(data)):
            if num != _GRAPH:
                continue
            if wire != _LEN:
                raise _Unfollowed
            pieces: list[bytes] = []
            gprev = vs
            for gs, gnum, gwire, gvs, gve in _fields(data, vs, ve):
                if gnum != _INITIALIZER:
                    continue
                if gwire != _LEN:
                    raise _Unfollowed
                raw: int | None = None
                kept: list[bytes] = []
                tprev = gvs
                for ts, tnum, twire, tvs, tve in _fields(data, gvs, gve):
                    if tnum == _RAW_DATA:
                        if twire != _LEN:
                            raise _Unfollowed
                        raw = tve - tvs  # the last occurrence wins, as in the parser
                        kept.append(data[tprev:ts])
                        tprev = tve
                lengths.append(raw)
                if raw is not None:
                    kept.append(data[tprev:gve])
                    pieces.append(data[gprev:gs])
                    pieces.append(_field(gnum, b"".join(kept)))
                    gprev = gve
            pieces.append(data[gprev:ve])
            out.append(data[prev:start])
            out.append(_field(num, b"".join(pieces)))
            prev = ve
        out.append(data[prev:])
        return lengths, b"".join(out)
    except _Unfollowed:
        return None
