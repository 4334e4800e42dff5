"""Outer-scope names: what a node's subgraphs (If/Loop/Scan bodies) read from enclosing graphs."""

from __future__ import annotations

from onnx_prepared import onnx_proto as onnx


def subgraph_outer_names(graph: onnx.GraphProto, memo: dict | None = None) -> set[str]:
    """Names a subgraph (recursively) reads from enclosing scopes (a new set: the caller may change it).

    ``memo`` (``id(graph) -> (graph, names)``, the graph held so its id stays its own) answers a body
    asked again: binding a Loop whose body holds an If asks of each body up to four times (the
    evaluator's outer names, the node's implicit inputs, at every nesting level)."""
    if memo is not None:
        hit = memo.get(id(graph))
        if hit is not None and hit[0] is graph:
            return set(hit[1])
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {i.name for i in graph.sparse_initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for a in node.attribute:
            for g in graphs_of(a):
                used |= subgraph_outer_names(g, memo)
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    used -= defined
    if memo is not None:
        memo[id(graph)] = (graph, frozenset(used))
    return used


def graphs_of(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The subgraphs one attribute holds (none, one, or a list)."""
    if a.type == onnx.AttributeProto.GRAPH:
        return [a.g]
    if a.type == onnx.AttributeProto.GRAPHS:
        return list(a.graphs)
    return []


def implicit_inputs_of(node: onnx.NodeProto, memo: dict | None = None) -> tuple[str, ...]:
    """The outer-scope names ``node``'s subgraphs read, sorted: the node's implicit inputs.

    Resolution asks it of every node several times, and almost no node has a subgraph: the common
    case reads each attribute's type once and allocates nothing. ``memo``: see
    :func:`subgraph_outer_names`."""
    names: set[str] | None = None
    for a in node.attribute:
        t = a.type
        if t != _GRAPH and t != _GRAPHS:
            continue
        if names is None:
            names = set()
        for g in graphs_of(a):
            names |= subgraph_outer_names(g, memo)
    return () if not names else tuple(sorted(names))


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS
