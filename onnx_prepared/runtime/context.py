"""RuntimeContext: caller-owned mutable bindings of a sequence of runs (the spec's KV-cache binding).

The session's shared state holds only immutable prepared objects; state that changes from one run to
the next and belongs to the caller, such as a KV cache, lives here instead. A context feeds its
``bindings`` to every run it is passed to and, when a run succeeds, rebinds each carried input to the
output named for it in ``carry``, so ``present.N.key`` becomes the next run's ``past_key_values.N.key``.

>>> ctx = RuntimeContext.kv_cache(sess.plan, past)   # carry: present.* -> past_key_values.*
>>> logits, *_ = sess.run({"input_ids": ids, "attention_mask": mask}, ctx)  # feeds ctx.bindings too
>>> ctx.bindings["past_key_values.0.key"].shape      # the run's present.0.key

Bindings are read when a run is submitted and rebound when it completes (a failed or cancelled run
leaves them as they were), so runs sharing one context must be submitted one after the other. A
submission holds its context until it is terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from onnx_prepared.errors import InvalidFeedError
from onnx_prepared.records import field, record

if TYPE_CHECKING:
    from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan


@record(eq=False)
class RuntimeContext:
    """Inputs the caller owns across runs, and which outputs replace them after each successful run."""

    bindings: dict[str, Any] = field(default_factory=dict)  # input name -> value fed to every run
    carry: Mapping[str, str] = field(default_factory=dict)  # output name -> input name it rebinds

    @classmethod
    def kv_cache(cls, plan: PreparedExecutionPlan, past: Mapping[str, Any] | None = None) -> RuntimeContext:
        """A context carrying every ``present*`` output to the ``past*`` input of the same suffix
        (``present.0.key`` -> ``past_key_values.0.key``, onnxruntime-genai's and optimum's names)."""
        ex = plan.execution
        inputs = [ex.slot_names[s] for s in ex.input_slots]
        by_suffix = {_suffix(n, "past"): n for n in inputs if n.startswith("past")}
        carry = {}
        for s in ex.output_slots:
            out = ex.slot_names[s]
            if out.startswith("present") and _suffix(out, "present") in by_suffix:
                carry[out] = by_suffix[_suffix(out, "present")]
        if not carry:
            raise InvalidFeedError(f"no present*/past* input-output pairs in this model (inputs: {inputs})")
        return cls(dict(past or {}), carry)

    def feeds(self, feeds: Mapping[str, Any]) -> Mapping[str, Any]:
        """The run's feeds: ``feeds`` plus the bindings (an input given both ways is refused)."""
        if not self.bindings:
            return feeds
        both = sorted(set(feeds).intersection(self.bindings))
        if both:
            raise InvalidFeedError(f"input {both[0]!r} is fed and also bound by the RuntimeContext: pass it one way")
        return {**self.bindings, **feeds}

    def rebind(self, slot_names: tuple[str, ...], output_slots: tuple[int, ...], values: list) -> None:
        """After a successful run: each carried output becomes the binding of its input."""
        for s in output_slots:
            target = self.carry.get(slot_names[s])
            if target is not None:
                self.bindings[target] = values[s]


def _suffix(name: str, prefix: str) -> str:
    """``past_key_values.0.key`` -> ``.0.key`` (``past``), ``present.0.key`` -> ``.0.key``."""
    rest = name[len(prefix):]
    if prefix == "past":
        for p in ("_key_values", "_kv", ""):
            if rest.startswith(p):
                return rest[len(p):]
    return rest
