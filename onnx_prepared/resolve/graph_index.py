"""What the resolver's rewrite passes read of every node, from one pass over the protobuf nodes.

Why: each field access of a protobuf message builds a wrapper object (``tuple(node.input)`` costs
~2 us a node), and every pass used to scan ``graph.node`` again for its gating test (is there any
BatchNormalization?), its consumer and producer maps and its subgraph test. The passes share one
:class:`GraphIndex`; a rewrite updates it from the nodes it wrote (:meth:`GraphIndex.rewritten`), a pass
that edits the graph some other way calls :meth:`GraphIndex.rescan`. Its lists are in graph order and
always describe ``graph.node`` as it is.
"""

from __future__ import annotations

from collections.abc import Iterable

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind.attributes import parse_attributes

_DEFAULT = ("", "ai.onnx")
_UNSET = object()  # an attribute dict not parsed yet
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


class GraphIndex:
    """Per node of ``graph``: ``op_types`` (the bare op type), ``domains``, ``names``, ``keys`` (the op
    type, prefixed by ``domain:`` outside the default domain), ``inputs`` and ``outputs`` (tuples of
    names, "" kept); ``graph_outputs`` the names the graph returns; ``consumers`` / ``producer`` maps
    built on first use; :meth:`attributes` parsed on first ask.

    ``subgraphs``: False when the model is known to hold no subgraph attribute (the loader's walk saw
    none); otherwise the graph's nodes are asked once, on first use. ``facts``: the loader's
    :data:`~onnx_prepared.model.versions.NodeFacts` of nodes ``graph`` holds unchanged (the resolver's
    skeleton copy), read instead of the nodes.
    """

    __slots__ = (
        "_attrs",
        "_consumers",
        "_present",
        "_producer",
        "_subgraphs",
        "domains",
        "graph",
        "graph_outputs",
        "inputs",
        "keys",
        "names",
        "op_types",
        "outputs",
    )

    def __init__(self, graph: onnx.GraphProto, *, subgraphs: bool | None = None, facts: tuple = ()) -> None:
        self.graph = graph
        self.graph_outputs = {o.name for o in graph.output}
        self._subgraphs: bool | None = False if subgraphs is False else None
        if facts and len(facts) == len(graph.node):
            self._from_facts(facts)
        else:
            self.rescan()

    def _from_facts(self, facts: tuple) -> None:
        op_types, domains, names, keys, inputs, outputs, attrs = [], [], [], [], [], [], []
        for op, d, name, ins, outs, a, _ in facts:
            op_types.append(op)
            domains.append(d)
            names.append(name)
            keys.append(op if d in _DEFAULT else f"{d}:{op}")
            inputs.append(ins)
            outputs.append(outs)
            attrs.append(_UNSET if a is None else a)
        self.op_types, self.domains, self.names, self.keys = op_types, domains, names, keys
        self.inputs, self.outputs, self._attrs = inputs, outputs, attrs
        self._changed()

    def rescan(self) -> None:
        """Read every node again (after a pass that edited the graph without :meth:`rewritten`)."""
        op_types, domains, names, keys, inputs, outputs = [], [], [], [], [], []
        for n in self.graph.node:
            op, d = n.op_type, n.domain
            op_types.append(op)
            domains.append(d)
            names.append(n.name)
            keys.append(op if d in _DEFAULT else f"{d}:{op}")
            inputs.append(tuple(n.input))
            outputs.append(tuple(n.output))
        self.op_types, self.domains, self.names, self.keys = op_types, domains, names, keys
        self.inputs, self.outputs = inputs, outputs
        self._attrs = [_UNSET] * len(op_types)
        self._changed()

    def _changed(self) -> None:
        self._present = None
        self._consumers = None
        self._producer = None
        if self._subgraphs:  # a dropped node may have held the subgraph: ask again on use
            self._subgraphs = None

    # ---- queries ----
    def attributes(self, i: int) -> dict | None:
        """Node ``i``'s attributes as ``parse_attributes`` returns them (None: attribute references);
        the caller must not change the dict (it may be the loader's)."""
        a = self._attrs[i]
        if a is _UNSET:
            a = self._attrs[i] = parse_attributes(self.graph.node[i])
        return a

    def has(self, *op_types: str) -> bool:
        """Whether a node of any domain has one of these op types."""
        present = self._present
        if present is None:
            present = self._present = set(self.op_types)
        return any(op in present for op in op_types)

    def of(self, *keys: str) -> list[int]:
        """Indices, in graph order, of the nodes whose key is one of ``keys``."""
        return [i for i, k in enumerate(self.keys) if k in keys]

    @property
    def consumers(self) -> dict[str, list[int]]:
        """Name -> indices of the nodes reading it, one entry per reading position ("" skipped)."""
        c = self._consumers
        if c is None:
            c = self._consumers = {}
            for i, ins in enumerate(self.inputs):
                for name in ins:
                    if name:
                        c.setdefault(name, []).append(i)
        return c

    @property
    def producer(self) -> dict[str, int]:
        """Name -> index of the (last) node writing it ("" skipped)."""
        p = self._producer
        if p is None:
            p = self._producer = {}
            for i, outs in enumerate(self.outputs):
                for name in outs:
                    if name:
                        p[name] = i
        return p

    @property
    def subgraphs(self) -> bool:
        """Whether a node holds a subgraph attribute (then a body may read any name: passes keep out)."""
        s = self._subgraphs
        if s is None:
            s = self._subgraphs = any(a.type in (_GRAPH, _GRAPHS) for n in self.graph.node for a in n.attribute)
        return s

    # ---- updates ----
    def rewritten(self, replace: dict[int, onnx.NodeProto], drop: Iterable[int]) -> None:
        """The graph's node ``i`` became ``replace[i]`` and the ``drop`` indices were deleted (what
        ``fusions._rewrite`` does): update the lists from the written nodes alone."""
        for i, n in replace.items():
            op, d = n.op_type, n.domain
            self.op_types[i] = op
            self.domains[i] = d
            self.names[i] = n.name
            self.keys[i] = op if d in _DEFAULT else f"{d}:{op}"
            self.inputs[i] = tuple(n.input)
            self.outputs[i] = tuple(n.output)
            self._attrs[i] = _UNSET
        for i in sorted(drop, reverse=True):
            del self.op_types[i], self.domains[i], self.names[i], self.keys[i], self.inputs[i], self.outputs[i]
            del self._attrs[i]
        self._changed()

    def fused(self, nodes: dict[int, tuple], drop: Iterable[int]) -> None:
        """Node ``i`` was rewritten in place into ``nodes[i]`` = (op_type, domain, inputs, outputs,
        attributes as ``parse_attributes`` would read them; its name kept) and the ``drop`` indices were
        deleted: update the lists from these facts, reading no node."""
        for i, (op, d, ins, outs, attrs) in nodes.items():
            self.op_types[i] = op
            self.domains[i] = d
            self.keys[i] = op if d in _DEFAULT else f"{d}:{op}"
            self.inputs[i] = ins
            self.outputs[i] = outs
            self._attrs[i] = attrs
        for i in sorted(drop, reverse=True):
            del self.op_types[i], self.domains[i], self.names[i], self.keys[i], self.inputs[i], self.outputs[i]
            del self._attrs[i]
        self._changed()

    def rewired(self, inputs: list[tuple[str, ...]], keep: list[int]) -> None:
        """The graph kept the nodes ``keep`` (old indices, in order), reading ``inputs`` (per kept node)."""
        self.op_types = [self.op_types[i] for i in keep]
        self.domains = [self.domains[i] for i in keep]
        self.names = [self.names[i] for i in keep]
        self._attrs = [self._attrs[i] for i in keep]
        self.keys = [self.keys[i] for i in keep]
        self.outputs = [self.outputs[i] for i in keep]
        self.inputs = inputs
        self._changed()
