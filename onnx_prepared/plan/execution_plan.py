"""The sequential ExecutionPlan: compact actions built once per session, replayed per run.

Values live in a flat list indexed by slot; the plan maps every graph name to a slot once. Each
:class:`ExecuteAction` carries its bound kernel, input/output slots and the slots whose last use it is,
so intermediates are released as soon as nothing later reads them. The replay loop touches no
protobuf and looks nothing up by name.

Slot :data:`NONE_SLOT` (0) always reads as ``None``: omitted optional inputs read it, omitted optional
outputs are written to it and the same action clears it again, so the loop needs no branch for either.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnx_prepared.errors import KernelError, ModelLoadError
from onnx_prepared.kernels.binding import BoundKernel, bind_node, implicit_inputs_of
from onnx_prepared.kernels.fallback import FallbackEnv

#: Slot that reads as None (omitted optional inputs; omitted outputs are written here and cleared).
NONE_SLOT = 0
#: Kept for callers of the first skeleton: an omitted input/output now maps to NONE_SLOT.
ABSENT = NONE_SLOT


@dataclass(frozen=True, slots=True)
class ExecuteAction:
    """Run one node, then release the slots whose last reader it was."""

    node_index: int
    kernel: BoundKernel
    inputs: tuple[int, ...]  # explicit inputs, then the kernel's implicit (outer-scope) inputs
    outputs: tuple[int, ...]
    release: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """Slots, constants and the ordered action list of one graph (immutable; shared by runs)."""

    slot_names: tuple[str, ...]
    input_slots: tuple[int, ...]  # graph inputs, in graph order (initializer-backed defaults excluded)
    output_slots: tuple[int, ...]
    constant_slots: dict[str, int]  # initializer name -> slot
    actions: tuple[ExecuteAction, ...]
    node_labels: tuple[str, ...]  # "name (op_type)" per node, for error messages
    # per action, what replay unpacks and nothing else (derived from actions): see _step()
    steps: tuple[tuple, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(_step(a) for a in self.actions))

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)

    def new_values(self) -> list:
        """A fresh per-run slot list (all None)."""
        return [None] * len(self.slot_names)

    def replay(
        self,
        values: list,
        *,
        on_release: Callable[[int], None] | None = None,
        on_step: Callable[[ExecuteAction, list], None] | None = None,
    ) -> None:
        """Execute every action over ``values`` (a per-run list of length ``n_slots``).

        ``on_step(action, values)`` runs after an action stored its outputs and before it releases
        anything (peak live memory); ``on_release(slot)`` after each release. Both are for tests and
        diagnostics; without them the loop is the bare hot path. Thread-safe: the plan is read-only.
        """
        if on_release is not None or on_step is not None:
            return self._replay_traced(values, on_release, on_step)
        for call, n_in, arg, out, outs, rel, act in self.steps:
            try:
                if n_in == 1:
                    res = call(values[arg])
                elif n_in:
                    res = call(*arg(values))
                else:
                    res = call()
                if out >= 0:
                    values[out] = res[0]
                else:
                    for slot, v in zip(outs, res):
                        values[slot] = v
            except Exception as e:
                raise self.kernel_error(act, [values[i] for i in act.inputs], e) from e
            for slot in rel:
                values[slot] = None
        return None

    def _replay_traced(self, values: list, on_release, on_step) -> None:
        for act in self.actions:
            args = [values[i] for i in act.inputs]
            try:
                res = act.kernel.call(*args)
                for slot, v in zip(act.outputs, res):
                    values[slot] = v
            except Exception as e:
                raise self.kernel_error(act, args, e) from e
            if on_step is not None:
                on_step(act, values)
            for slot in act.release:
                values[slot] = None
                if on_release is not None:
                    on_release(slot)

    def kernel_error(self, act: ExecuteAction, args: Sequence, e: BaseException) -> KernelError:
        """The user-facing error for a failed kernel: node, op, kernel and every input's dtype/shape."""
        sig = ", ".join(_describe(a) for a in args)
        return KernelError(f"node {self.node_labels[act.node_index]} [{act.kernel.name}] failed on inputs ({sig}): "
                           f"{type(e).__name__}: {e}")


def _step(act: ExecuteAction) -> tuple:
    """``(call, n_in, arg, out, outs, release, action)``: arity-specialised so the replay loop avoids
    building an argument list (``arg`` is the slot for one input, an itemgetter for several) and a zip
    for the common single output (``out`` is its slot, or -1 when there are several)."""
    ins = act.inputs
    arg = ins[0] if len(ins) == 1 else (operator.itemgetter(*ins) if ins else None)
    out = act.outputs[0] if len(act.outputs) == 1 else -1
    return (act.kernel.call, len(ins), arg, out, act.outputs, act.release, act)


def _describe(a: object) -> str:
    if a is None:
        return "None"
    if isinstance(a, list):
        return f"seq[{len(a)}]({', '.join(_describe(x) for x in a[:3])}{', ...' if len(a) > 3 else ''})"
    if hasattr(a, "dtype") and hasattr(a, "shape"):
        return f"{a.dtype}{list(a.shape)}"
    return type(a).__name__


def build_execution_plan(
    graph: onnx.GraphProto,
    opsets: dict[str, int],
    functions: Mapping[tuple[str, str], onnx.FunctionProto] | None = None,
    *,
    bind: Callable[[onnx.NodeProto], BoundKernel] | None = None,
    outer_names: Sequence[str] = (),
    env: FallbackEnv | None = None,
) -> ExecutionPlan:
    """Topologically order ``graph``, bind every node and compute last uses.

    ``outer_names`` are values a subgraph may read from enclosing scopes (they get input slots);
    ``env`` is the fallback state shared with the enclosing graph (built here when omitted).
    Raises ModelLoadError when a node reads, or the graph outputs, a name nothing produces.
    """
    functions = dict(functions or {})
    implicit = [implicit_inputs_of(n) for n in graph.node]
    if bind is None:
        env = env or FallbackEnv(opsets, functions)

        def bind(n: onnx.NodeProto, _imp: tuple[str, ...] | None = None) -> BoundKernel:
            return bind_node(n, opsets, functions, env=env, implicit=_imp)

        bind_with_implicit = True
    else:
        bind_with_implicit = False
    slots: dict[str, int] = {"": NONE_SLOT}

    def slot(name: str) -> int:
        s = slots.get(name)
        if s is None:
            s = slots[name] = len(slots)
        return s

    init_names = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    input_slots = tuple(slot(i.name) for i in graph.input if i.name not in init_names)
    for i in graph.input:  # inputs that also have an initializer default
        slot(i.name)
    constant_slots = {n: slot(n) for n in sorted(init_names)}
    for n in outer_names:
        slot(n)
    order = _topological_order(graph, implicit, set(slots))
    labels = tuple(
        f"{node.name or '#' + str(idx)!r} ({node.domain + '::' if node.domain else ''}{node.op_type})"
        for idx, node in enumerate(graph.node)
    )
    bound = []
    for idx in order:
        node = graph.node[idx]
        k = bind(node, implicit[idx]) if bind_with_implicit else bind(node)
        ins = tuple(slot(n) for n in node.input) + tuple(slot(n) for n in k.implicit_inputs)
        outs = tuple(slot(n) for n in node.output)
        bound.append((idx, k, ins, outs))
    produced = {s for _, _, _, outs in bound for s in outs}
    available = produced | set(input_slots) | set(constant_slots.values()) | {slots[i.name] for i in graph.input}
    available |= {slots[n] for n in outer_names}
    for o in graph.output:
        if o.name not in slots or slots[o.name] not in available:
            raise ModelLoadError(f"graph output {o.name!r} is not produced by any node, input or initializer")
    output_slots = tuple(slots[o.name] for o in graph.output)
    keep = set(output_slots) | set(input_slots) | set(constant_slots.values()) | {NONE_SLOT}
    keep |= {slots[i.name] for i in graph.input} | {slots[n] for n in outer_names}
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
    return ExecutionPlan(tuple(names), input_slots, output_slots, constant_slots, tuple(actions), labels)


def _topological_order(graph: onnx.GraphProto, implicit: list[tuple[str, ...]], available: set[str]) -> list[int]:
    """Node indices in an order where every input is produced first (Kahn; stable on file order)."""
    produced_by: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for o in node.output:
            if o:
                if o in produced_by:
                    raise ModelLoadError(f"value {o!r} is produced twice (node {node.name!r}, {node.op_type})")
                produced_by[o] = idx
    deps: list[set[int]] = []
    for idx, node in enumerate(graph.node):
        d = set()
        for n in (*node.input, *implicit[idx]):
            if not n:
                continue
            if n in produced_by:
                d.add(produced_by[n])
            elif n not in available:
                raise ModelLoadError(f"node {node.name!r} ({node.op_type}) reads {n!r}, which nothing produces")
        deps.append(d)
    if all(all(d < i for d in ds) for i, ds in enumerate(deps)):
        return list(range(len(graph.node)))
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
    if len(order) != len(graph.node):
        stuck = [graph.node[i].name or f"#{i}" for i in range(len(graph.node)) if indeg[i] > 0]
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
        from onnx import numpy_helper

        from onnx_prepared.kernels.binding import subgraph_outer_names

        self.graph = graph
        outer = sorted(subgraph_outer_names(graph))
        self._plan = plan = build_execution_plan(graph, env.opsets, env.function_protos, outer_names=outer, env=env)
        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        self._feed_slots = tuple((n, plan.slot_names.index(n)) for n in dict.fromkeys([*self.input_names, *outer]))
        self._constants = plan.new_values()
        for t in graph.initializer:
            self._constants[plan.constant_slots[t.name]] = numpy_helper.to_array(t)
        for sp in graph.sparse_initializer:
            dense = numpy_helper.to_array(sp.values)
            indices = numpy_helper.to_array(sp.indices)
            full = np.zeros(int(np.prod(sp.dims)), dtype=dense.dtype)
            full[np.ravel_multi_index(indices.T, tuple(sp.dims)) if indices.ndim == 2 else indices] = dense
            self._constants[plan.constant_slots[sp.values.name]] = full.reshape(tuple(sp.dims))

    def run(self, output_names, feeds: Mapping, attributes=None, **_kwargs) -> list:
        values = list(self._constants)
        for name, slot in self._feed_slots:
            values[slot] = feeds.get(name)
        self._plan.replay(values)
        if output_names is None:
            return [values[s] for s in self._plan.output_slots]
        index = dict(zip(self.output_names, self._plan.output_slots))
        return [values[index[n]] for n in output_names]


def live_bytes(values: list) -> int:
    """Bytes held by ndarray values in a slot list (test and diagnostics helper)."""
    return sum(v.nbytes for v in values if isinstance(v, np.ndarray))
