"""Bind a whole graph into its frozen ExecutionPlan; subgraph bodies get one of their own.

:func:`build_execution_plan` orders the nodes topologically, gives every value a slot, binds every
node (or takes the bindings resolution made) and computes last uses. :class:`SubgraphEvaluator` is the
subgraph factory handed to the reference fallback (:func:`graph_env`): an If/Loop/Scan body keeps the
reference op's semantics while its nodes get fast kernels and slot-indexed replay.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind.execution_plan import NONE_SLOT, ExecuteAction, ExecutionPlan
from onnx_prepared.bind.fallback_env import FallbackEnv
from onnx_prepared.bind.kernel import BoundKernel, bind_kernel, specialize_constants
from onnx_prepared.bind.scopes import implicit_inputs_of, subgraph_outer_names
from onnx_prepared.errors import ModelLoadError
from onnx_prepared.scheduler.task import checkpoint


def graph_env(opsets: Mapping[str, int], functions: Mapping[tuple[str, str], onnx.FunctionProto] | None = None
              ) -> FallbackEnv:
    """The fallback state of one graph, whose subgraph bodies run as :class:`SubgraphEvaluator`."""
    return FallbackEnv(opsets, functions or {}, subgraph=SubgraphEvaluator)


def bind_node(
    node: onnx.NodeProto,
    opsets: dict[str, int],
    functions: Mapping[tuple[str, str], onnx.FunctionProto] | None = None,
    *,
    env: FallbackEnv | None = None,
    implicit: tuple[str, ...] | None = None,
) -> BoundKernel:
    """Bind one node on its own (tests, single-node checks): :func:`bind_kernel` with a fresh env."""
    return bind_kernel(node, env or graph_env(opsets, functions), implicit=implicit)


def build_execution_plan(
    graph: onnx.GraphProto,
    opsets: dict[str, int],
    functions: Mapping[tuple[str, str], onnx.FunctionProto] | None = None,
    *,
    bind: Callable[[onnx.NodeProto], BoundKernel] | None = None,
    kernels: Sequence[BoundKernel] | None = None,
    outer_names: Sequence[str] = (),
    env: FallbackEnv | None = None,
    node_io: tuple[Sequence[tuple[str, ...]], Sequence[tuple[str, ...]]] | None = None,
    node_meta: Sequence[tuple[str, str, str]] | None = None,
    init_names: set[str] | None = None,
) -> ExecutionPlan:
    """Topologically order ``graph``, bind every node and compute last uses.

    ``kernels`` are the nodes' bindings made earlier (per node index: the ResolvedModel's); else
    ``bind(node)`` binds each node; else :func:`~onnx_prepared.bind.kernel.bind_kernel` does, with
    ``env`` (the fallback state shared with the enclosing graph; built here when omitted).
    ``outer_names`` are values a subgraph may read from enclosing scopes (they get input slots).
    ``node_io``: every node's (input names, output names) when the caller already read them (the
    plan takes them from the ResolvedModel); they must be what the graph's nodes hold. ``node_meta``:
    likewise every node's (name, domain, op_type); with both, no node proto is read except a Constant's.
    ``init_names``: the names of the graph's initializers and sparse initializers when the caller has
    them (reading each TensorProto's name was ~1 us an initializer).
    Raises ModelLoadError when a node reads, or the graph outputs, a name nothing produces.
    """
    functions = dict(functions or {})
    # indexed only for a Constant's value and in errors when the caller read the nodes' fields already
    nodes = graph.node
    n_nodes = len(nodes)
    # every node's names once: protobuf's repeated fields build new str objects on each access
    if node_io is not None and len(node_io[0]) == n_nodes == len(node_io[1]):
        node_ins, node_outs = list(node_io[0]), list(node_io[1])
    else:
        nodes = list(nodes)
        node_ins = [tuple(n.input) for n in nodes]
        node_outs = [tuple(n.output) for n in nodes]
    # implicit inputs: the earlier bindings carry them (a node without subgraphs has none)
    implicit = ([k.implicit_inputs for k in kernels] if kernels is not None and len(kernels) == n_nodes
                else [implicit_inputs_of(n, env.outer_names_memo if env is not None else None) for n in nodes])
    if kernels is None and bind is None:
        env = env or graph_env(opsets, functions)
    slots: dict[str, int] = {"": NONE_SLOT}

    def slot(name: str) -> int:
        s = slots.get(name)
        if s is None:
            s = slots[name] = len(slots)
        return s

    if init_names is None:
        init_names = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    graph_inputs = [i.name for i in graph.input]
    output_names = [o.name for o in graph.output]
    input_slots = tuple(slot(n) for n in graph_inputs if n not in init_names)
    for n in graph_inputs:  # inputs that also have an initializer default
        slot(n)
    constant_slots = {n: slot(n) for n in sorted(init_names)}
    for n in outer_names:
        slot(n)
    order = _topological_order(nodes, node_ins, node_outs, implicit, set(slots))
    metas = (node_meta if node_meta is not None and len(node_meta) == n_nodes
             else [(n.name, n.domain, n.op_type) for n in nodes])  # each field read once
    labels = NodeLabels(tuple(metas))
    bound = []
    presets: list[tuple[int, object]] = []
    known: dict[int, object] = {NONE_SLOT: None}  # slots whose value binding knows: folded constants
    graph_outputs = set(output_names)
    sget = slots.get
    for idx in order:
        if kernels is not None:
            k = kernels[idx]
        elif bind is not None:
            k = bind(nodes[idx])
        else:
            k = bind_kernel(nodes[idx], env, implicit=implicit[idx])
        n_in = len(node_ins[idx])
        ins = tuple([s if (s := sget(n)) is not None else slot(n) for n in node_ins[idx]])
        if k.implicit_inputs:
            ins += tuple(slot(n) for n in k.implicit_inputs)
        outs = tuple([s if (s := sget(n)) is not None else slot(n) for n in node_outs[idx]])
        value = (_folded_constant(metas[idx][1], node_outs[idx][0], k, graph_outputs)
                 if not n_in and metas[idx][2] == "Constant" and len(node_outs[idx]) == 1 else None)
        if value is not None:
            presets.append((outs[0], value))
            known[outs[0]] = value
            continue
        consts = {i: known[s] for i, s in enumerate(ins[:n_in]) if s in known}
        bound.append((idx, specialize_constants(k, consts, n_in), ins, outs))
    const_slots = set(constant_slots.values())
    named = {slots[n] for n in graph_inputs} | {slots[n] for n in outer_names}
    produced = {s for _, _, _, outs in bound for s in outs} | {s for s, _ in presets}
    available = produced | set(input_slots) | const_slots | named
    for n in output_names:
        if n not in slots or slots[n] not in available:
            raise ModelLoadError(f"graph output {n!r} is not produced by any node, input or initializer")
    output_slots = tuple(slots[n] for n in output_names)
    keep = set(output_slots) | set(input_slots) | const_slots | {NONE_SLOT}
    keep |= {s for s, _ in presets}  # a folded constant's slot is refilled from the template each run
    keep |= named
    last_use: dict[int, int] = {}
    for pos, (_, _, ins, outs) in enumerate(bound):
        for s in ins + outs:
            last_use[s] = pos
    releases: dict[int, list[int]] = {}
    for s, pos in last_use.items():
        if s not in keep:
            releases.setdefault(pos, []).append(s)
    actions = []
    for pos, (idx, k, ins, outs) in enumerate(bound):
        rel = sorted(releases.get(pos, ()))
        if NONE_SLOT in outs:  # an omitted output was written to the none slot: clear it at once
            rel.append(NONE_SLOT)
        actions.append(ExecuteAction(idx, k, ins, outs, tuple(rel)))
    names = [""] * len(slots)
    for n, s in slots.items():
        names[s] = n
    return ExecutionPlan(tuple(names), input_slots, output_slots, constant_slots, tuple(actions), labels,
                         tuple(presets))


class NodeLabels(Sequence):
    """``"'name' (domain::op_type)"`` per node (``'#i'`` for an unnamed one), spelt out when an error
    message asks for one: a plan's nodes mostly never fail, and formatting every label at binding was
    ~0.4 us a node. Compares equal to the tuple of the labels."""

    __slots__ = ("_metas",)

    def __init__(self, metas: tuple[tuple[str, str, str], ...]) -> None:
        self._metas = metas  # (name, domain, op_type) per node

    def __len__(self) -> int:
        return len(self._metas)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return tuple(self)[idx]
        name, domain, op_type = self._metas[idx]
        return f"{name or '#' + str(idx % len(self._metas))!r} ({domain + '::' if domain else ''}{op_type})"

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, NodeLabels) else other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


def _folded_constant(domain: str, output: str, k: BoundKernel, graph_outputs: set[str]) -> np.ndarray | None:
    """The value of a Constant node without inputs and with the one ``output`` (the caller checked), computed
    once here (read-only: every run shares it), or None to keep the node as an action: another domain's
    op, a graph output (the caller owns what it gets back), or a kernel that fails (the run raises the
    node's KernelError, as before)."""
    if domain not in ("", "ai.onnx") or not output or output in graph_outputs or k.implicit_inputs:
        return None
    try:
        (value,) = k.call()
    except Exception:
        return None
    if type(value) is not np.ndarray:
        return None
    value = value.view()
    value.setflags(write=False)  # (half of ``value.flags.writeable = False``, which builds a flags object)
    return value


def _topological_order(nodes: Sequence[onnx.NodeProto], node_ins: list[tuple[str, ...]],
                       node_outs: list[tuple[str, ...]], implicit: list[tuple[str, ...]],
                       available: set[str]) -> list[int]:
    """Node indices in an order where every input is produced first (Kahn; stable on file order)."""
    produced_by: dict[str, int] = {}
    for idx, outs in enumerate(node_outs):
        for o in outs:
            if o:
                if o in produced_by:
                    node = nodes[idx]
                    raise ModelLoadError(f"value {o!r} is produced twice (node {node.name!r}, {node.op_type})")
                produced_by[o] = idx
    deps: list[set[int]] = []
    in_order = True
    for idx, ins in enumerate(node_ins):
        d = set()
        for n in (*ins, *implicit[idx]) if implicit[idx] else ins:
            if not n:
                continue
            p = produced_by.get(n)
            if p is not None:
                d.add(p)
                in_order = in_order and p < idx
            elif n not in available:
                node = nodes[idx]
                raise ModelLoadError(f"node {node.name!r} ({node.op_type}) reads {n!r}, which nothing produces")
        deps.append(d)
    if in_order:
        return list(range(len(nodes)))
    users: dict[int, list[int]] = {}
    indeg = [len(d) for d in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(i)
    ready = [i for i, n in enumerate(indeg) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or f"#{i}" for i in range(len(nodes)) if indeg[i] > 0]
        raise ModelLoadError(f"graph has a cycle through nodes {stuck[:5]}")
    return order


class SubgraphEvaluator:
    """A subgraph (If/Loop/Scan/SequenceMap body) run by its own ExecutionPlan.

    Shaped like the ``ReferenceEvaluator`` that onnx.reference's control-flow ops call
    (``input_names``, ``output_names``, ``run(None, feeds)``), so those ops keep their semantics while
    the body's nodes get fast kernels and slot-indexed replay. ``feeds`` holds the body inputs and
    any outer-scope values; names it lacks read as None. Read-only after construction (thread-safe).
    """

    has_linked_attribute = False

    def __init__(self, graph: onnx.GraphProto, env: FallbackEnv):
        self.graph = graph
        self.outer_names = outer = tuple(sorted(subgraph_outer_names(graph, env.outer_names_memo)))
        self._plan = plan = build_execution_plan(graph, env.opsets, env.function_protos, outer_names=outer, env=env)
        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        self._feed_slots = tuple((n, plan.slot_names.index(n)) for n in dict.fromkeys([*self.input_names, *outer]))
        self._constants = plan.new_values()
        for t in graph.initializer:
            self._constants[plan.constant_slots[t.name]] = onnx.to_array(t)
        for sp in graph.sparse_initializer:
            dense = onnx.to_array(sp.values)
            indices = onnx.to_array(sp.indices)
            full = np.zeros(int(np.prod(sp.dims)), dtype=dense.dtype)
            full[np.ravel_multi_index(indices.T, tuple(sp.dims)) if indices.ndim == 2 else indices] = dense
            self._constants[plan.constant_slots[sp.values.name]] = full.reshape(tuple(sp.dims))

    def runner(self, outer: Sequence[str]) -> Callable[[Sequence, Sequence], list]:
        """``run(inputs, outer_values) -> outputs`` by position: ``inputs`` in graph-input order,
        ``outer_values`` in ``outer`` order (a superset of the names this body reads). The native
        control-flow kernels call it once per iteration: no names, no dicts."""
        plan = self._plan
        slot_of = {n: i for i, n in enumerate(plan.slot_names)}
        mine = set(self.outer_names)
        outer_pairs = tuple((j, slot_of[n]) for j, n in enumerate(outer) if n in mine)
        in_pairs = tuple((j, slot_of[n]) for j, n in enumerate(self.input_names) if n)
        out_slots = plan.output_slots
        constants = self._constants
        replay = plan.replay

        def run(inputs: Sequence, outer_values: Sequence) -> list:
            checkpoint()  # once per body evaluation: a Loop with a huge trip count honours cancel()
            values = list(constants)
            for j, s in outer_pairs:
                values[s] = outer_values[j]
            for j, s in in_pairs:
                values[s] = inputs[j]
            replay(values)
            return [values[s] for s in out_slots]

        return run

    def run(self, output_names, feeds: Mapping, attributes=None, **_kwargs) -> list:
        checkpoint()  # once per body evaluation: a Loop/Scan with a huge trip count honours cancel()
        values = list(self._constants)
        for name, slot in self._feed_slots:
            values[slot] = feeds.get(name)
        self._plan.replay(values)
        if output_names is None:
            return [values[s] for s in self._plan.output_slots]
        index = dict(zip(self.output_names, self._plan.output_slots))
        return [values[index[n]] for n in output_names]
