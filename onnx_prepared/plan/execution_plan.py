"""The sequential ExecutionPlan: compact actions built once per session, replayed per run.

Values live in a flat list indexed by slot; the plan maps every graph name to a slot once. Each
:class:`ExecuteAction` carries its bound kernel, input/output slots and the slots whose last use it is,
so intermediates are released as soon as nothing later reads them. The replay loop touches no
protobuf and looks nothing up by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnx_prepared.errors import KernelError, ModelLoadError
from onnx_prepared.kernels.binding import BoundKernel, bind_node

#: Slot index meaning "optional input omitted".
ABSENT = -1


@dataclass(frozen=True, slots=True)
class ExecuteAction:
    """Run one node, then release the slots whose last reader it was."""

    node_index: int
    kernel: BoundKernel
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]  # ABSENT for omitted optional outputs
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

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)

    def replay(self, values: list, *, on_release: Callable[[int], None] | None = None) -> None:
        """Execute every action over ``values`` (a per-run list of length ``n_slots``)."""
        for act in self.actions:
            args = [values[i] if i >= 0 else None for i in act.inputs]
            try:
                res = act.kernel.call(*args)
            except Exception as e:
                raise self.kernel_error(act, args, e) from e
            for slot, v in zip(act.outputs, res):
                if slot >= 0:
                    values[slot] = v
            for slot in act.release:
                values[slot] = None
                if on_release is not None:
                    on_release(slot)

    def kernel_error(self, act: ExecuteAction, args: Sequence, e: BaseException) -> KernelError:
        sig = ", ".join(
            "None" if a is None else f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', []))}"
            for a in args
        )
        return KernelError(f"node {self.node_labels[act.node_index]} [{act.kernel.name}] failed on inputs ({sig}): "
                           f"{type(e).__name__}: {e}")


def build_execution_plan(
    graph: onnx.GraphProto,
    opsets: dict[str, int],
    functions: dict[tuple[str, str], onnx.FunctionProto] | None = None,
    *,
    bind: Callable[[onnx.NodeProto], BoundKernel] | None = None,
) -> ExecutionPlan:
    """Topologically order ``graph``, bind every node and compute last uses."""
    bind = bind or (lambda n: bind_node(n, opsets, functions))
    slots: dict[str, int] = {}

    def slot(name: str) -> int:
        if name not in slots:
            slots[name] = len(slots)
        return slots[name]

    init_names = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    input_slots = tuple(slot(i.name) for i in graph.input if i.name not in init_names)
    for i in graph.input:  # inputs that also have an initializer default
        slot(i.name)
    constant_slots = {n: slot(n) for n in sorted(init_names)}
    order = _topological_order(graph, set(slots))
    bound = []
    labels = []
    for idx, node in enumerate(graph.node):
        labels.append(f"{node.name or '#' + str(idx)!r} ({node.domain + '::' if node.domain else ''}{node.op_type})")
    for idx in order:
        node = graph.node[idx]
        k = bind(node)
        ins = tuple(slot(n) if n else ABSENT for n in node.input) + tuple(slot(n) for n in k.implicit_inputs)
        outs = tuple(slot(n) if n else ABSENT for n in node.output)
        bound.append((idx, k, ins, outs))
    output_slots = tuple(slot(o.name) for o in graph.output)
    keep = set(output_slots) | set(input_slots) | set(constant_slots.values())
    last_use: dict[int, int] = {}
    for pos, (_, _, ins, outs) in enumerate(bound):
        for s in ins + outs:
            if s >= 0:
                last_use[s] = pos
    releases: dict[int, list[int]] = {}
    for s, pos in last_use.items():
        if s not in keep:
            releases.setdefault(pos, []).append(s)
    actions = tuple(
        ExecuteAction(idx, k, ins, outs, tuple(sorted(releases.get(pos, ()))))
        for pos, (idx, k, ins, outs) in enumerate(bound)
    )
    names = [""] * len(slots)
    for n, s in slots.items():
        names[s] = n
    return ExecutionPlan(tuple(names), input_slots, output_slots, constant_slots, actions, tuple(labels))


def _topological_order(graph: onnx.GraphProto, available: set[str]) -> list[int]:
    """Node indices in an order where every input is produced first (Kahn; stable on file order)."""
    produced_by: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for o in node.output:
            if o:
                produced_by[o] = idx
    deps: list[set[int]] = []
    for node in graph.node:
        names = set(n for n in node.input if n)
        for a in node.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                from onnx_prepared.kernels.binding import implicit_inputs_of

                names |= set(implicit_inputs_of(node))
                break
        d = set()
        for n in names:
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
    import heapq

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
        raise ModelLoadError("graph has a cycle")
    return order


def live_bytes(values: list) -> int:
    """Bytes held by ndarray values in a slot list (test and diagnostics helper)."""
    return sum(v.nbytes for v in values if isinstance(v, np.ndarray))
