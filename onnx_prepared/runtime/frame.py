"""ExecutionFrame: one run's mutable state over the immutable plan (onnxruntime's name for it).

The plan (:class:`~onnx_prepared.plan.PreparedExecutionPlan`, its slot-indexed ``ExecutionPlan``) is
frozen and shared by every run; a frame holds what belongs to one run only: the slot values, the
ExecutionArena allocations of its activations, the program counter, the prepared objects it pinned and
the producers it bound to at submission. Frames are never shared between runs, and one task at a time
works on a frame (the scheduler runs a continuation once per resume), so a frame takes no lock.

Both inference paths execute through the frame, over the plan's one kernel-call loop
(``ExecutionPlan.replay``), and account for activations the same way, through one mechanism: the
frame holds an ExecutionArena *reservation* of its activation high-water mark (:meth:`_reserve` only
grows it; :meth:`release_allocations` returns it when the run ends). An arena limit therefore fails a
run exactly when its activation peak would exceed it, on either path, with the same ArenaLimitError.

* :meth:`step` (cold): one action; its outputs are sized before anything is released (an output the
  action itself releases counts), its last-use values are released, and the reservation grows to the
  live bytes when they pass it: the run's peak is *measured*.
* :meth:`replay` (hot): every action at once; the reservation is the session's measured peak, taken
  once before the first kernel. With no measured peak yet (a run before any cold run finished) it
  steps instead, measuring it, so that a hot and a cold run of the same model leave the same arena
  figures (live, peak) and the common case stays one acquisition per run.
"""

from __future__ import annotations

from typing import Any

from onnx_prepared.bind import ExecutionPlan
from onnx_prepared.memory import Allocation, Arena
from onnx_prepared.records import field, record
from onnx_prepared.resolve import PreparedKey
from onnx_prepared.runtime.context import RuntimeContext


@record(eq=False, slots=True)
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
    #: requirement bit -> the SourceForm (source arrays) this run computes from while it is not resident
    forms: dict[int, Any] = field(default_factory=dict)
    late: list = field(default_factory=list)  # producer tasks held back until the run ends (source forms)
    sizes: dict[int, int] = field(default_factory=dict)  # slot -> bytes of a live activation (step only)
    live_bytes: int = 0  # invariant: sum(sizes.values())
    peak_bytes: int = 0  # the largest live_bytes of this run (replay: the peak it reserved)
    reservation: list[Allocation] = field(default_factory=list)  # ExecutionArena charges of this run
    reserved_bytes: int = 0  # invariant: sum of reservation's bytes == the high-water mark reserved

    def __repr__(self) -> str:
        return (f"<ExecutionFrame run-{self.invocation_id} pc={self.pc} segment={self.segment} "
                f"pinned={len(self.pinned)} live={self.live_bytes}B peak={self.peak_bytes}B>")

    def replay(self, execution: ExecutionPlan, activation_bytes: int) -> int:
        """Every action, reserving ``activation_bytes`` (the measured peak) once; returns the peak.

        ``activation_bytes == 0`` (nothing measured yet): steps through the actions instead, which
        measures the peak. The reservation is returned when the replay ends, however it ends.
        """
        try:
            if activation_bytes:
                self._reserve(activation_bytes)
                self.peak_bytes = activation_bytes
                execution.replay(self.values)
                self.pc = len(execution.actions)
            else:
                while self.pc < len(execution.actions):
                    self.step(execution)
        finally:
            self.release_allocations()
        return self.peak_bytes

    def step(self, execution: ExecutionPlan) -> None:
        """The action at ``pc``: its outputs sized, the reservation grown to the live bytes, then the
        values it read (or wrote) last released."""
        values = self.values
        act = execution.step(values, self.pc)
        sizes = self.sizes
        live = self.live_bytes
        for slot in act.outputs:
            live += getattr(values[slot], "nbytes", 0) - sizes.pop(slot, 0)  # NONE_SLOT may repeat
            sizes[slot] = getattr(values[slot], "nbytes", 0)
        if live > self.peak_bytes:
            self.peak_bytes = live
            self._reserve(live)
        for slot in act.release:
            values[slot] = None
            live -= sizes.pop(slot, 0)
        self.live_bytes = live
        self.pc += 1

    def _reserve(self, nbytes: int) -> None:
        """Grow this run's ExecutionArena reservation to ``nbytes`` (never shrinks; the one place a
        frame charges the arena)."""
        if nbytes > self.reserved_bytes:
            self.reservation.append(self.arena.acquire(nbytes - self.reserved_bytes,
                                                       f"activations of run {self.invocation_id}"))
            self.reserved_bytes = nbytes

    def release_allocations(self) -> None:
        """Return the reservation (the run ended: success, failure or cancel). Idempotent."""
        for a in self.reservation:
            a.release()
        self.reservation.clear()
        self.reserved_bytes = 0
        self.sizes.clear()
        self.live_bytes = 0

    def carry(self, execution: ExecutionPlan) -> None:
        """A successful run rebinds its context's carried inputs to its outputs (a KV cache)."""
        ctx = self.context
        if ctx is not None and ctx.carry:
            ctx.rebind(execution.slot_names, execution.output_slots, self.values)
