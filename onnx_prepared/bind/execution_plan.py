"""The frozen, slot-indexed ExecutionPlan of one graph: compact bound actions, replayed per run.

Built by :func:`onnx_prepared.bind.graph.build_execution_plan` (the main graph, where the prepared
plan's invocation tasks index into its action list, and every subgraph body).

Values live in a flat list indexed by slot; the plan maps every graph name to a slot once. Each
:class:`ExecuteAction` carries its bound kernel, input/output slots and the slots whose last use it is,
so intermediates are released as soon as nothing later reads them. The replay loop touches no
protobuf and looks nothing up by name.

Slot :data:`NONE_SLOT` (0) always reads as ``None``: omitted optional inputs read it, omitted optional
outputs are written to it and the same action clears it again, so the loop needs no branch for either.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnx_prepared.bind.kernel import BoundKernel
from onnx_prepared.errors import KernelError

#: Slot that reads as None (omitted optional inputs; omitted outputs are written here and cleared).
NONE_SLOT = 0


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


def live_bytes(values: list) -> int:
    """Bytes held by ndarray values in a slot list (test and diagnostics helper)."""
    return sum(v.nbytes for v in values if isinstance(v, np.ndarray))
