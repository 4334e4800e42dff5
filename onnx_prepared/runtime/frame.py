"""ExecutionFrame: one run's mutable state over the immutable plan (onnxruntime's name for it).

The plan (:class:`~onnx_prepared.plan.PreparedExecutionPlan`, its slot-indexed ``ExecutionPlan``) is
frozen and shared by every run; a frame holds what belongs to one run only: the slot values, the
ExecutionArena allocations of its activations, the program counter, the prepared objects it pinned and
the producers it bound to at submission. Frames are never shared between runs, and one task at a time
works on a frame (the scheduler runs a continuation once per resume), so a frame takes no lock.

Both inference paths execute through the frame, over the plan's one kernel-call loop
(``ExecutionPlan.replay``), and charge their activations to the ExecutionArena through it:

* :meth:`replay` (hot): every action at once; the arena is charged the session's measured activation
  peak once for the whole run (an ExecutionArena limit fails the run before its first kernel, with the
  same ArenaLimitError a cold run would meet) and released when the run ends;
* :meth:`step` (cold): one action; each output is charged as it is produced and released at its last
  use, which measures the run's peak (what later hot runs charge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnx_prepared.bind import ExecutionPlan
from onnx_prepared.memory import Allocation, Arena
from onnx_prepared.resolve import PreparedKey
from onnx_prepared.runtime.context import RuntimeContext


@dataclass(eq=False, slots=True)
class ExecutionFrame:
    """Values, allocations and program counter of one run. Not thread-safe: one task uses it at a time."""

    invocation_id: int
    values: list  # slot -> value; feeds bound at submission, outputs read from it at the end
    arena: Arena  # the session's ExecutionArena
    context: RuntimeContext | None = None  # caller-owned bindings (a KV cache), rebound on success
    pc: int = 0  # next action to execute
    segment: int = 0  # next invocation range of the plan (cold path)
    pinned: dict[int, PreparedKey] = field(default_factory=dict)  # requirement bit -> key pinned now
    held: set[int] = field(default_factory=set)  # requirement bits this run has used (or the caller fed)
    bound: dict[int, Any] = field(default_factory=dict)  # requirement bit -> producer task bound at submit
    allocations: dict[int, Allocation] = field(default_factory=dict)  # slot -> ExecutionArena allocation
    live_bytes: int = 0  # invariant: sum of allocations' bytes
    peak_bytes: int = 0  # the largest live_bytes of this run

    def __repr__(self) -> str:
        return (f"<ExecutionFrame run-{self.invocation_id} pc={self.pc} segment={self.segment} "
                f"pinned={len(self.pinned)} live={self.live_bytes}B peak={self.peak_bytes}B>")

    def replay(self, execution: ExecutionPlan, activation_bytes: int) -> None:
        """Every action, charging ``activation_bytes`` (the measured peak) once for the run."""
        scratch = self.arena.acquire(activation_bytes, "activations of a hot run")
        try:
            execution.replay(self.values)
        finally:
            scratch.release()
        self.pc = len(execution.actions)

    def step(self, execution: ExecutionPlan) -> None:
        """The action at ``pc``: its outputs charged as activations, the values it read last released."""
        pc = self.pc
        act = execution.actions[pc]
        values = self.values
        execution.replay(values, pc, pc + 1)
        allocs = self.allocations
        arena = self.arena
        for slot in act.outputs:
            old = allocs.pop(slot, None)
            if old is not None:  # an omitted optional output shares one scratch slot
                old.release()
                self.live_bytes -= old.nbytes
            nb = getattr(values[slot], "nbytes", 0)
            if nb:
                allocs[slot] = arena.acquire(nb, "activation")
                self.live_bytes += nb
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        for slot in act.release:
            a = allocs.pop(slot, None)
            if a is not None:
                a.release()
                self.live_bytes -= a.nbytes
        self.pc = pc + 1

    def release_allocations(self) -> None:
        """Return every activation still charged (the run ended: success, failure or cancel)."""
        for a in self.allocations.values():
            a.release()
        self.allocations.clear()
        self.live_bytes = 0

    def carry(self, execution: ExecutionPlan) -> None:
        """A successful run rebinds its context's carried inputs to its outputs (a KV cache)."""
        ctx = self.context
        if ctx is not None and ctx.carry:
            ctx.rebind(execution.slot_names, execution.output_slots, self.values)
