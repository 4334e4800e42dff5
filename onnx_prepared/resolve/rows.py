"""Rows on demand: a large constant Gather table is read row by row until the whole of it is resident.

A prompt of 16 tokens needs 16 rows of a 131 MB float32 embedding. Resolution marks a raw requirement
as a *row table* when every node reading it gathers rows along axis 0 with runtime indices (``Gather``
with ``axis=0`` over the table; ``GatherBlockQuantized`` with ``gather_axis=0`` over its data, scales and
zero points, whose rows line up) and its payload is external and at least :data:`MIN_TABLE_BYTES`.
Those nodes' bound calls are wrapped by :func:`row_capable`. A ``Reshape`` between the table and such
nodes is looked through when it keeps axis 0 (genai's tied embedding: GatherBlockQuantized over a
Reshape of the LM head's INT4 weight); its call is wrapped by :func:`row_reshape`.

While the table is not resident, the cold path (``runtime/inference.py``) puts a :class:`RowView` in
its slot instead of waiting: the wrapped call reads the rows its indices touch on the critical path
(hinted together, then gathered from one mapping of their span, or one positioned read when they are
one contiguous run: ``ExternalDataReader.read_rows``) and gathers from that compact block. The whole table is
read at background priority behind the run's other reads (or never, under a residency budget) and, once
resident, runs gather from it as before. A table whose source also feeds a consumer that needs all of it
(a tied embedding that is also the MatMulNBits LM head's packed source) is still read whole for that
consumer: :attr:`RowTable.whole_for` names it, ``inspect --plan`` prints both. On a companion hit that
consumer's packed form is read from the companion and the source is a dormant payload for it, so
nothing needs the table whole before the output: it is read by rows and whole at background priority
after the run, like an untied table (:attr:`RowTable.cached_for` names the consumers served so).

A recorded sha256 covers the whole tensor, so a row read cannot be checked by itself, and under a
residency budget the whole tensor is never read. The first row read of a view therefore asks the
reader to verify the whole tensor (``ExternalDataReader.verify_whole``: streamed in pieces on the
verification thread, nothing retained; skipped when a verification record or an earlier read vouches
for the bytes). The semantics are those of every deferred verification (``model/verify.py``): the run
that gathered the rows waits for it before it returns and raises ``ExternalDataError`` on a mismatch,
and so does every later run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from onnx_prepared.model import ExternalDataReader, WeightDescriptor
from onnx_prepared.model.reader import row_runs
from onnx_prepared.records import record, replace

#: Smaller tables are read whole: one read is cheaper than a few row reads.
MIN_TABLE_BYTES = 1 << 20
#: Row runs of one table closer than this are hinted as one range (reading the gap costs ~40 us here)
HINT_GAP = 64 << 10
#: ... of at most this many bytes (within the kernel's readahead maximum per WILLNEED call)
HINT_PIECE = 1 << 20

#: node (domain, op_type) -> (input positions holding row-aligned tables, indices position)
_ROW_OPS = {("", "Gather"): ((0,), 1), ("com.microsoft", "GatherBlockQuantized"): ((0, 2, 3), 1)}


@record(frozen=True, slots=True)
class RowTable:
    """One constant table read by rows: which consumers read rows, which need the whole tensor."""

    source: str  # the initializer (its manifest entry)
    rows: int
    row_bytes: int
    row_nodes: tuple[str, ...]  # nodes that gather rows of it
    whole_for: tuple[str, ...] = ()  # other requirements built from the same source (read whole for them)
    cached_for: tuple[str, ...] = ()  # other requirements of the source served by the companion cache

    def describe(self) -> str:
        whole = f"; whole tensor for {', '.join(self.whole_for)}" if self.whole_for else \
            "; whole tensor at background priority"
        if self.cached_for:
            whole += f" (cached packed form for {', '.join(self.cached_for)})"
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
        if data is not None and (len(data.dims) != 2 or data.dtype != np.uint8):
            return None  # packed uint8 rows [N, K*bits/8]; int4-typed data has half-byte rows
        if int(attrs.get("gather_axis", 0)) != 0 or int(attrs.get("quantize_axis", 1)) not in (1, -1):
            return None
    if len(node.input) <= idx or not node.input[idx] or node.input[idx] in weights:
        return None  # constant indices: nothing to gain
    present = tuple(p for p in tables if p < len(node.input) and node.input[p])
    return present, idx


class NodeView(NamedTuple):
    """What the row-table pass reads of a node (the resolver's lists, not the protobuf's fields)."""

    op_type: str
    domain: str
    name: str
    input: tuple[str, ...]
    output: tuple[str, ...]


def has_candidates(weights: Mapping[str, WeightDescriptor], requirements: Sequence[Any]) -> bool:
    """Whether a raw requirement's one source is external and large enough to be a row table (most models
    have none: :func:`find_row_tables` then walks no node, and its caller need not describe them)."""
    return any(r.spec is None and len(r.sources) == 1 and weights[r.sources[0]].is_external
               and weights[r.sources[0]].nbytes >= MIN_TABLE_BYTES for r in requirements)


def find_row_tables(nodes: Sequence[Any], node_attrs: Sequence[Mapping[str, Any] | None],
                    weights: Mapping[str, WeightDescriptor], requirements: Sequence[Any],
                    outputs: frozenset[str] = frozenset()) -> tuple[dict[str, RowTable], dict[int, tuple[int, ...]]]:
    """({source: RowTable}, {node index: table positions}) for the row tables of a resolved graph.

    ``nodes`` are NodeProtos or :class:`NodeView` s. ``requirements`` are the PreparedRequirements (raw ones
    have ``spec`` None); a source qualifies when
    its raw requirement's consumers all gather rows of it (directly, or through a Reshape whose output
    only they read, ``outputs`` being the graph outputs) and its payload is external and large enough.
    A Reshape to wrap is returned with the table positions ``()``.
    """
    if not has_candidates(weights, requirements):
        return {}, {}  # no candidate table (most models): no per-node walk
    row_ops = {i: _row_op(n, a, weights) for i, (n, a) in enumerate(zip(nodes, node_attrs))}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            if name:
                readers.setdefault(name, []).append(i)

    def rows_only(name: str, i: int) -> bool:
        """Node ``i`` reads ``name`` only at positions where rows are gathered."""
        spec = row_ops[i]
        return spec is not None and all(x != name or p in spec[0] for p, x in enumerate(nodes[i].input))

    reshapes: dict[int, str] = {}  # Reshape node -> the table it reshapes
    for i, n in enumerate(nodes):
        if (n.op_type == "Reshape" and n.domain in ("", "ai.onnx") and len(n.input) == 2 and n.input[0] in weights
                and n.input[1] and n.output[0] not in outputs and readers.get(n.output[0])
                and all(rows_only(n.output[0], c) for c in readers[n.output[0]])):
            reshapes[i] = n.input[0]
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
        if not all(c < len(nodes) and (rows_only(name, c) or (reshapes.get(c) == name
                                       and list(nodes[c].input).count(name) == 1)) for c in r.consumers):
            continue
        row_nodes = []
        for c in r.consumers:
            via = [nodes[u] for u in readers[nodes[c].output[0]]] if c in reshapes else [nodes[c]]
            row_nodes += [n.name or n.op_type for n in via if (n.name or n.op_type) not in row_nodes]
        others = [o for o in requirements if o is not r and name in o.sources]
        whole = tuple(str(o.key) for o in others if not o.cached)
        cached = tuple(str(o.key) for o in others if o.cached)
        tables[name] = RowTable(name, d.dims[0], d.nbytes // d.dims[0], tuple(row_nodes), whole, cached)
    viewable = set(tables) | {nodes[i].output[0] for i, t in reshapes.items() if t in tables}
    wrapped: dict[int, tuple[int, ...]] = {i: () for i, t in reshapes.items() if t in tables}
    for i, spec in row_ops.items():
        if spec is not None and any(nodes[i].input[p] in viewable for p in spec[0]):
            wrapped[i] = spec[0]
    return tables, wrapped


# **** run time: the view the cold path puts in a table's slot, and the wrapped call ****


class RowView:
    """A table not yet resident: reads rows of it on demand through the session's external-data reader.

    Thread-safe (positioned reads; no state besides the counters, which only grow).
    """

    __slots__ = ("_stats", "desc", "reader")

    def __init__(self, desc: WeightDescriptor, reader: ExternalDataReader, _stats: list | None = None) -> None:
        self.desc = desc
        self.reader = reader
        # rows read, reads, whole-tensor verification requested (shared by reshaped views)
        self._stats = _stats if _stats is not None else [0, 0, 0]

    @property
    def rows_read(self) -> int:
        return self._stats[0]

    @property
    def reads(self) -> int:
        return self._stats[1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.desc.dims)

    def reshaped(self, row_shape: tuple[int, ...]) -> RowView:
        """The same rows seen with another row shape (a Reshape that keeps axis 0)."""
        return RowView(replace(self.desc, dims=(self.desc.dims[0], *row_shape)), self.reader, self._stats)

    def hint(self, rows: np.ndarray) -> None:
        """Ask the kernel to start reading rows ``rows`` (sorted, unique) now (``will_need``): scattered
        row reads then wait about one device latency in all instead of one each, in turn behind the
        I/O workers' streaming reads. :func:`row_capable` hints every table of a node before it takes.
        Runs closer than :data:`HINT_GAP` bytes are asked for as one range of at most :data:`HINT_PIECE`
        bytes (one call each: a call releases the GIL and must take it back, which on a cold start costs
        more than reading the gap; 2 x 128 calls took 5-43 ms there)."""
        if len(rows) < 2:
            return
        starts, stops = row_runs(rows)
        if len(starts) < 2:
            return  # one run: one read, nothing to overlap
        d = self.desc
        row_bytes = d.payload.length // d.dims[0]
        self.reader.will_need(d, hint_ranges([(d.payload.offset + int(rows[a]) * row_bytes, (b - a) * row_bytes)
                                              for a, b in zip(starts, stops)]))

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, unique, in range) as one array (``ExternalDataReader.read_rows``)."""
        d = self.desc
        row_shape = tuple(d.dims[1:])
        row_bytes = d.payload.length // d.dims[0]
        if not self._stats[2]:  # before the rows are used: the run's check_verified() then waits for it
            self._stats[2] = 1
            self.reader.verify_whole(d)
        out = np.empty(len(rows) * row_bytes, np.uint8)
        if len(rows):
            self._stats[1] += self.reader.read_rows(d, rows, out)
        self._stats[0] += len(rows)
        return out.view(d.dtype).reshape((len(rows), *row_shape))


def hint_ranges(ranges: list[tuple[int, int]], gap: int = HINT_GAP, piece: int = HINT_PIECE) -> list[tuple[int, int]]:
    """(offset, length) ranges, ascending, with those closer than ``gap`` merged and none longer than
    ``piece`` (a longer one is cut: the kernel reads at most its readahead maximum per WILLNEED call)."""
    merged: list[list[int]] = []
    for off, n in ranges:
        if merged and off - (merged[-1][0] + merged[-1][1]) <= gap and off + n - merged[-1][0] <= piece:
            merged[-1][1] = off + n - merged[-1][0]
        else:
            merged.append([off, n])
    out = []
    for off, n in merged:
        while n > 0:
            k = min(n, piece)
            out.append((off, k))
            off, n = off + k, n - k
    return out


def row_capable(call: Callable[..., tuple], tables: tuple[int, ...], indices: int = 1, *,
                strict: bool = True) -> Callable[..., tuple]:
    """``call`` that also accepts RowViews at positions ``tables``: it then gathers from the rows its
    indices touch (a compact table, indices remapped). Arrays at those positions pass through as is.

    An index out of range raises IndexError naming the table's size (``strict``, Gather), or stays out
    of range in the compact table (GatherBlockQuantized zeroes those rows).
    """

    def rows_call(*args):
        if not any(type(args[p]) is RowView for p in tables if p < len(args) and args[p] is not None):
            return call(*args)
        args = list(args)
        n = next(args[p] for p in tables if type(args[p]) is RowView).shape[0]
        idx = np.asarray(args[indices]).astype(np.int64)
        norm = np.where(idx < 0, idx + n, idx)
        valid = (norm >= 0) & (norm < n)
        if strict and not valid.all():
            raise IndexError(f"index {int(idx[~valid].reshape(-1)[0])} is out of bounds for axis 0 with size {n}")
        # NOTE: return_inverse keeps numpy.ma unloaded: without it numpy 2.4's unique asks np.ma.is_masked,
        # importing numpy.ma (12-16 ms of a cold first run; test_a_cold_run_gathering_rows_does_not_import_numpy_ma)
        rows, inverse = np.unique(norm[valid], return_inverse=True)
        compact = np.full(idx.shape, len(rows), np.int64)  # out of range in the compact table too
        compact[valid] = inverse.reshape(-1)
        views = [args[p] for p in tables if p < len(args) and type(args[p]) is RowView]
        for v in views:  # every table's rows requested before the first is read
            v.hint(rows)
        for p in tables:
            if p < len(args) and args[p] is not None:
                a = args[p]
                args[p] = a.take(rows) if type(a) is RowView else np.take(a, rows, axis=0)
        args[indices] = compact if idx.ndim else compact.reshape(())
        return call(*args)

    return rows_call


def row_reshape(call: Callable[..., tuple], *, allowzero: int = 0) -> Callable[..., tuple]:
    """A Reshape ``call`` that passes a RowView through as a RowView when the new shape keeps axis 0;
    otherwise (or for an array) it reshapes as written, reading the whole table first."""

    def reshape_call(x, shape):
        if type(x) is not RowView:
            return call(x, shape)
        n, row = x.shape[0], x.shape[1:]
        dims = [int(v) for v in np.asarray(shape).reshape(-1)]
        if not allowzero:
            dims = [x.shape[i] if d == 0 and i < len(x.shape) else d for i, d in enumerate(dims)]
        rest = int(np.prod(row, dtype=np.int64))
        tail = dims[1:]
        if tail.count(-1) == 1:
            known = int(np.prod([d for d in tail if d != -1], dtype=np.int64))
            if known > 0 and rest % known == 0:
                tail = [rest // known if d == -1 else d for d in tail]
        if dims and dims[0] == n and min(tail, default=0) >= 0 and int(np.prod(tail, dtype=np.int64)) == rest:
            return (x.reshaped(tuple(tail)),)
        return call(x.take(np.arange(n)), shape)

    return reshape_call
