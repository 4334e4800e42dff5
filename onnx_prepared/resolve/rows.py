"""Rows on demand: a large constant Gather table is read row by row until the whole of it is resident.

A prompt of 16 tokens needs 16 rows of a 131 MB float32 embedding. Resolution marks a raw requirement
as a *row table* when every node reading it gathers rows along axis 0 with runtime indices (``Gather``
with ``axis=0`` over the table; ``GatherBlockQuantized`` with ``gather_axis=0`` over its data, scales and
zero points, whose rows line up) and its payload is external and at least :data:`MIN_TABLE_BYTES`.
Those nodes' bound calls are wrapped by :func:`row_capable`.

While the table is not resident, the cold path (``runtime/inference.py``) puts a :class:`RowView` in
its slot instead of waiting: the wrapped call reads the rows its indices touch, one positioned read per
contiguous run of rows, on the critical path, and gathers from that compact block. The whole table is
read at background priority behind the run's other reads (or never, under a residency budget) and, once
resident, runs gather from it as before. A table whose source also feeds a consumer that needs all of it
(a tied embedding that is also the MatMulNBits LM head's packed source) is still read whole for that
consumer: :attr:`RowTable.whole_for` names it, ``inspect --plan`` prints both.

NOTE: a row read is not checked against the tensor's recorded sha256 (it covers the whole tensor); the
full read that follows verifies it, and a run that starts after a failed verification raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_prepared.model import ExternalDataReader, WeightDescriptor

#: Smaller tables are read whole: one read is cheaper than a few row reads.
MIN_TABLE_BYTES = 1 << 20

#: node (domain, op_type) -> (input positions holding row-aligned tables, indices position)
_ROW_OPS = {("", "Gather"): ((0,), 1), ("com.microsoft", "GatherBlockQuantized"): ((0, 2, 3), 1)}


@dataclass(frozen=True, slots=True)
class RowTable:
    """One constant table read by rows: which consumers read rows, which need the whole tensor."""

    source: str  # the initializer (its manifest entry)
    rows: int
    row_bytes: int
    row_nodes: tuple[str, ...]  # nodes that gather rows of it
    whole_for: tuple[str, ...] = ()  # other requirements built from the same source (read whole for them)

    def describe(self) -> str:
        whole = f"; whole tensor for {', '.join(self.whole_for)}" if self.whole_for else \
            "; whole tensor at background priority"
        return (f"row-granular reads ({self.rows} rows x {self.row_bytes} B) for node(s) "
                f"{', '.join(repr(n) for n in self.row_nodes)}{whole}")


def _row_op(node: Any, attrs: Mapping[str, Any] | None, weights: Mapping[str, WeightDescriptor]
            ) -> tuple[tuple[int, ...], int] | None:
    """(table positions, indices position) when ``node`` gathers rows of constant tables, else None."""
    spec = _ROW_OPS.get(("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type))
    if spec is None or attrs is None:
        return None
    tables, idx = spec
    if node.op_type == "Gather":
        if int(attrs.get("axis", 0)) != 0:
            return None
    else:
        data = weights.get(node.input[0])
        if data is None or len(data.dims) != 2 or data.dtype != np.uint8:
            return None  # packed uint8 rows [N, K*bits/8]; int4-typed data has half-byte rows
        if int(attrs.get("gather_axis", 0)) != 0 or int(attrs.get("quantize_axis", 1)) not in (1, -1):
            return None
    if len(node.input) <= idx or not node.input[idx] or node.input[idx] in weights:
        return None  # constant indices: nothing to gain
    present = tuple(p for p in tables if p < len(node.input) and node.input[p])
    if not all(node.input[p] in weights for p in present):
        return None
    return present, idx


def find_row_tables(nodes: Sequence[Any], node_attrs: Sequence[Mapping[str, Any] | None],
                    weights: Mapping[str, WeightDescriptor], requirements: Sequence[Any]
                    ) -> tuple[dict[str, RowTable], dict[int, tuple[int, ...]]]:
    """({source: RowTable}, {node index: table positions}) for the row tables of a resolved graph.

    ``requirements`` are the PreparedRequirements (raw ones have ``spec`` None); a source qualifies when
    its raw requirement's consumers all gather rows of it and its payload is external and large enough.
    """
    row_ops = {i: _row_op(n, a, weights) for i, (n, a) in enumerate(zip(nodes, node_attrs))}
    tables: dict[str, RowTable] = {}
    for r in requirements:
        if r.spec is not None or len(r.sources) != 1:
            continue
        name = r.sources[0]
        d = weights[name]
        if not d.is_external or d.nbytes < MIN_TABLE_BYTES or not d.dims or d.dims[0] < 2:
            continue
        if d.dtype.kind not in "biuf" or d.dtype.name in ("int4", "uint4"):
            continue
        ok = all(c < len(nodes) and row_ops[c] is not None
                 and all(nodes[c].input[p] != name or p in row_ops[c][0] for p in range(len(nodes[c].input)))
                 for c in r.consumers)
        if not ok:
            continue
        whole = tuple(str(o.key) for o in requirements if o is not r and name in o.sources)
        tables[name] = RowTable(name, d.dims[0], d.nbytes // d.dims[0],
                                tuple(nodes[c].name or nodes[c].op_type for c in r.consumers), whole)
    wrapped: dict[int, tuple[int, ...]] = {}
    for i, spec in row_ops.items():
        if spec is not None and all(nodes[i].input[p] in tables for p in spec[0]):
            wrapped[i] = spec[0]
    return tables, wrapped


# **** run time: the view the cold path puts in a table's slot, and the wrapped call ****


class RowView:
    """A table not yet resident: reads rows of it on demand through the session's external-data reader.

    Thread-safe (positioned reads; no state besides the counters, which only grow).
    """

    __slots__ = ("desc", "reader", "reads", "rows_read")

    def __init__(self, desc: WeightDescriptor, reader: ExternalDataReader) -> None:
        self.desc = desc
        self.reader = reader
        self.rows_read = 0
        self.reads = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.desc.dims)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, unique, in range) as one array; one read per contiguous run of rows."""
        d = self.desc
        p = d.payload
        row_shape = tuple(d.dims[1:])
        row_bytes = p.length // d.dims[0]
        out = np.empty(len(rows) * row_bytes, np.uint8)
        if len(rows):
            breaks = np.flatnonzero(np.diff(rows) != 1) + 1
            starts = np.concatenate(([0], breaks))
            stops = np.concatenate((breaks, [len(rows)]))
            for a, b in zip(starts.tolist(), stops.tolist()):
                first = int(rows[a])
                sub = dataclasses.replace(p, offset=p.offset + first * row_bytes, length=(b - a) * row_bytes,
                                          checksum=None)
                part = WeightDescriptor(d.name, d.elem_type, (b - a, *row_shape), sub)
                self.reader.read_bytes(part, out[a * row_bytes: b * row_bytes])
                self.reads += 1
        self.rows_read += len(rows)
        return out.view(d.dtype).reshape((len(rows), *row_shape))


def row_capable(call: Callable[..., tuple], tables: tuple[int, ...], indices: int = 1, *,
                strict: bool = True) -> Callable[..., tuple]:
    """``call`` that also accepts RowViews at positions ``tables``: it then gathers from the rows its
    indices touch (a compact table, indices remapped). Arrays at those positions pass through as is.

    An index out of range raises IndexError naming the table's size (``strict``, Gather), or stays out
    of range in the compact table (GatherBlockQuantized zeroes those rows).
    """

    def rows_call(*args):
        if not any(type(args[p]) is RowView for p in tables if p < len(args)):
            return call(*args)
        args = list(args)
        n = next(args[p] for p in tables if type(args[p]) is RowView).shape[0]
        idx = np.asarray(args[indices]).astype(np.int64)
        norm = np.where(idx < 0, idx + n, idx)
        valid = (norm >= 0) & (norm < n)
        if strict and not valid.all():
            raise IndexError(f"index {int(idx[~valid].reshape(-1)[0])} is out of bounds for axis 0 with size {n}")
        rows, inverse = np.unique(norm[valid], return_inverse=True)
        compact = np.full(idx.shape, len(rows), np.int64)  # out of range in the compact table too
        compact[valid] = inverse.reshape(-1)
        for p in tables:
            if p < len(args) and args[p] is not None:
                a = args[p]
                args[p] = a.take(rows) if type(a) is RowView else np.take(a, rows, axis=0)
        args[indices] = compact if idx.ndim else compact.reshape(())
        return call(*args)

    return rows_call
