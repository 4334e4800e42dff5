"""If, Loop and Scan of our own: their bodies run on ExecutionPlans built once per node, at binding.

Each body becomes the graph's subgraph evaluator (:class:`~onnx_prepared.bind.graph.SubgraphEvaluator`,
reached through the :class:`FallbackEnv`'s subgraph factory, so this module needs nothing from
``graph``); a run calls it as one generated function of its inputs and outer values (its plan's
``ExecutionPlan.function``, else its positional runner): no onnx.reference, no per-iteration dicts. The
node's outer-scope values (its ``implicit_inputs``) arrive after the explicit inputs, in the order of
``implicit``, and each body picks the ones it reads.

Semantics follow onnxruntime (and the reference op patches they replace, reference.py):

* If: a single-element condition selects the branch; its outputs are returned as they are (an empty
  optional or a sequence included).
* Loop: ``M`` (trip count) and ``cond`` are optional; the body gets the iteration number (int64, or
  ``M``'s dtype), the current condition and the loop-carried values, and returns the next condition,
  the carried values and its scan outputs, which are stacked along a new axis 0 (``[0, *dims]`` of
  the declared type when no iteration ran). Cancellation is checked once per body evaluation.
* Scan (opset 9+): the states carry over; each step reads the scan inputs' slice along their axes
  (from the end for direction 1); the scan outputs stack along their output axes (in reverse step
  order for direction 1). Scan-8 (batch axis, ``sequence_lens``) stays on the reference fallback.

Bodies whose nodes take attributes by reference (function bodies) stay on the reference fallback.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind.fallback_env import FallbackEnv, references_attributes
from onnx_prepared.scheduler.task import checkpoint

#: default-domain ops this module binds
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def bind_control_flow(node: onnx.NodeProto, env: FallbackEnv, implicit: tuple[str, ...],
                      opset: int) -> Callable | None:
    """The native call of an If/Loop/Scan node, ``call(*inputs, *implicit_values) -> tuple``; None when
    the node is not one, or must stay with the reference (no subgraph factory, attribute references,
    Scan-8's batch axis)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in CONTROL_FLOW or env.subgraph_factory is None:
        return None
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if any(references_attributes(g) for g in graphs.values()):
        return None
    if node.op_type == "If":
        if set(graphs) != {"then_branch", "else_branch"}:
            return None
        return _bind_if(*(_branch(graphs[k], env, implicit) for k in ("then_branch", "else_branch")))
    if set(graphs) != {"body"}:
        return None
    body = graphs["body"]
    if node.op_type == "Scan":
        return _bind_scan(node, body, env, implicit) if opset >= 9 else None
    n_carried = len(node.input) - 2
    if n_carried < 0 or len(body.input) != n_carried + 2 or len(body.output) < n_carried + 1:
        return None  # malformed: the reference's error names it
    empties = tuple(_empty_scan(o.type) for o in body.output[1 + n_carried:])
    slots = _Slots.of(body, env, implicit)
    if slots is None:
        return _bind_loop(_runner(body, env, implicit), len(node.input), n_carried, empties)
    return _bind_slot_loop(slots, len(node.input), n_carried, empties)


def _bind_scan(node: onnx.NodeProto, body: onnx.GraphProto, env: FallbackEnv,
               implicit: tuple[str, ...]) -> Callable | None:
    """Scan-9+: N states and M scan inputs sliced along their axes (reversed for direction 1); the K
    per-step outputs are stacked along their output axes (in reverse step order for direction 1)."""
    attrs = {a.name: a for a in node.attribute}
    m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
    n_in = len(node.input)
    n_state = n_in - m
    n_scan_out = len(body.output) - n_state
    if m < 1 or n_state < 0 or n_scan_out < 0 or len(body.input) != n_in:
        return None  # malformed: the reference's error names it

    def ints(name: str, n: int) -> list[int]:
        v = list(attrs[name].ints) if name in attrs else []
        return v if v else [0] * n

    in_axes, in_dirs = ints("scan_input_axes", m), ints("scan_input_directions", m)
    out_axes, out_dirs = ints("scan_output_axes", n_scan_out), ints("scan_output_directions", n_scan_out)
    if not (len(in_axes) == len(in_dirs) == m and len(out_axes) == len(out_dirs) == n_scan_out):
        return None
    run = _runner(body, env, implicit)
    empties = tuple(_empty_scan(o.type) for o in body.output[n_state:])

    def scan(*args: Any) -> tuple:
        states, seqs, outer = list(args[:n_state]), args[n_state:n_in], args[n_in:]
        axes = [a + s.ndim if a < 0 else a for a, s in zip(in_axes, seqs)]
        lengths = {s.shape[a] for s, a in zip(seqs, axes)}
        if len(lengths) != 1:
            raise ValueError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
        (length,) = lengths
        steps: list[list] = [[] for _ in range(n_scan_out)]
        for t in range(length):
            sliced = [np.take(s, length - 1 - t if d else t, axis=a) for s, a, d in zip(seqs, axes, in_dirs)]
            out = run((*states, *sliced), outer)
            states = out[:n_state]
            for k in range(n_scan_out):
                steps[k].append(out[n_state + k])
        results = []
        for k in range(n_scan_out):
            if not steps[k]:
                results.append(empties[k].copy())
                continue
            vals = steps[k][::-1] if out_dirs[k] else steps[k]
            stacked = np.stack(vals)
            axis = out_axes[k] + stacked.ndim if out_axes[k] < 0 else out_axes[k]
            results.append(np.moveaxis(stacked, 0, axis) if axis else stacked)
        return (*states, *results)

    return scan


def _empty_scan(tp: onnx.TypeProto) -> np.ndarray:
    """A scan output after zero iterations, as onnxruntime gives it: ``[0, *dims]`` of the body output's
    declared type (unknown dims 0; float32 ``[0]`` when the body declares no tensor type)."""
    if not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
        return np.empty((0,), np.float32)
    tt = tp.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 0 for d in tt.shape.dim]
    return np.empty((0, *dims), onnx.tensor_dtype_to_np_dtype(tt.elem_type))


def _runner(graph: onnx.GraphProto, env: FallbackEnv, implicit: tuple[str, ...]
            ) -> Callable[[Sequence, Sequence], list]:
    return env.subgraph_factory(graph, env).runner(implicit)


class _Slots:
    """A body's ExecutionPlan addressed by slot, for callers that fill one slot list themselves: a Loop
    fills it once per call (constants, outer-scope values) and per iteration writes only its inputs,
    an If branch returns its outputs as the tuple a kernel returns. Built once, at binding.

    ``inputs`` holds the slot of each body input (None for an unnamed one); ``outer`` the (position in
    the node's implicit values, slot) pairs this body reads. Read-only (shared by concurrent runs: each
    call fills its own list)."""

    __slots__ = ("constants", "inputs", "n_outer", "outer", "outputs", "plan", "replay")

    def __init__(self, plan: Any, constants: list, inputs: tuple, outer: tuple, outputs: tuple,
                 n_outer: int) -> None:
        self.plan = plan
        self.replay = plan.replay
        self.constants = constants
        self.inputs = inputs
        self.outer = outer
        self.outputs = outputs
        self.n_outer = n_outer

    @classmethod
    def of(cls, graph: onnx.GraphProto, env: FallbackEnv, implicit: tuple[str, ...]) -> _Slots | None:
        """The body's slots, or None when its evaluator is not the plan-backed one (then callers use
        its positional runner)."""
        ev = env.subgraph_factory(graph, env)
        plan, constants = getattr(ev, "_plan", None), getattr(ev, "_constants", None)
        names, mine = getattr(plan, "slot_names", None), getattr(ev, "outer_names", None)
        if names is None or constants is None or mine is None or not hasattr(plan, "replay"):
            return None
        slot_of = {n: i for i, n in enumerate(names)}
        mine = set(mine)
        return cls(plan, constants, tuple(slot_of[i.name] if i.name else None for i in graph.input),
                   tuple((j, slot_of[n]) for j, n in enumerate(implicit) if n in mine), tuple(plan.output_slots),
                   len(implicit))

    def function(self, inputs: Sequence[int | None] = ()) -> Callable[..., tuple] | None:
        """The body as ``fn(*inputs, *outer_values) -> outputs tuple`` (``ExecutionPlan.function``):
        ``inputs`` are the slots of the leading arguments, then come all the node's implicit values
        (each body reads its own); None when the plan keeps to :meth:`fresh` and ``replay``."""
        outer: list[int | None] = [None] * self.n_outer
        for j, s in self.outer:
            outer[j] = s
        function = getattr(self.plan, "function", None)
        return function((*inputs, *outer), self.constants) if function is not None else None

    def loop(self, n_in: int, n_carried: int, empties: tuple[np.ndarray, ...]) -> Callable[..., tuple] | None:
        """The whole Loop as one generated function, ``loop(trip, cond, *carried, *outer_values)``, its
        body's lines inside the ``while`` over local variables (``ExecutionPlan.body_code``): what
        :func:`_bind_function_loop` computes, without a call, an argument tuple and an output tuple
        per iteration. None when the body's plan has no code of its own."""
        body_code = getattr(self.plan, "body_code", None)
        n_start = n_in - 2  # the carried inputs the node gives (the body takes n_carried of them)
        if body_code is None or len(self.inputs) != 2 + n_carried or n_start < n_carried:
            return None
        args = [(self.inputs[0], "_i"), (self.inputs[1], "_cond")]
        args += [(s, f"a{k}") for k, s in enumerate(self.inputs[2:])]
        args += [(s, f"o{j}") for j, s in self.outer]
        code = body_code(args, self.constants, "      ")
        if code is None:
            return None
        lines, glob, names = code
        outs = self.outputs
        carried = [names.get(s, "None") for s in outs[1:1 + n_carried]]
        scans = [names.get(s, "None") for s in outs[1 + n_carried:]]
        glob.update(_start=_loop_start, _more=_loop_more, _array=np.array, _stack=_stack, checkpoint=checkpoint,
                    **{f"_e{k}": e for k, e in enumerate(empties)})
        params = ["trip", "cond", *(f"a{k}" for k in range(n_carried)), *(f"_x{k}" for k in range(n_start - n_carried)),
                  *(f"o{j}" for j in range(self.n_outer))]
        it = ["      _i = _array(_it, dtype=_dt)"] if names.get(self.inputs[0]) == "_i" else []
        source = [
            f"def loop({', '.join(params)}):",
            "  _limit, _dt, _keep, _cond = _start(trip, cond)",
            *(f"  _s{k} = []" for k in range(len(scans))),
            "  _it = 0",
            "  try:",
            "    while _keep and (_limit is None or _it < _limit):",
            "      checkpoint()  # once per body evaluation: a Loop with a huge trip count honours cancel()",
            *it,
            *lines,
            *(f"      _s{k}.append({v})" for k, v in enumerate(scans)),
            # one assignment: each output is read as the body left it (a carried input can be another's output)
            f"      _cond, {''.join(f'a{k}, ' for k in range(n_carried))}= {names.get(outs[0], 'None')}, "
            f"{''.join(v + ', ' for v in carried)}",
            "      _keep = _more(_cond)",
            "      _it += 1",
            "  except Exception as e:",
            f"    _failed(loop, e, locals(), _names, {7 + len(scans) + len(it)})",  # (the line of action 0)
            f"  return ({''.join(f'a{k}, ' for k in range(n_carried))}"
            f"{''.join(f'_stack(_s{k}, _e{k}), ' for k in range(len(scans)))})",
        ]
        return self.plan.make_function("loop", source, glob, names)

    def fresh(self, outer_values: Sequence) -> list:
        """A slot list holding the constants and this body's outer-scope values."""
        values = list(self.constants)
        for j, s in self.outer:
            values[s] = outer_values[j]
        return values


def _branch(graph: onnx.GraphProto, env: FallbackEnv, implicit: tuple[str, ...]) -> Callable[..., tuple]:
    """``run(*outer_values) -> outputs tuple`` of an If branch (no inputs of its own).

    No cancellation checkpoint: a branch runs its body once, a Loop around it checks once per
    iteration and a Loop inside it per its own iterations."""
    slots = _Slots.of(graph, env, implicit)
    if slots is None:
        run = _runner(graph, env, implicit)
        none: tuple = ()
        return lambda *outer: tuple(run(none, outer))
    replay, constants, outer_pairs, outs = slots.replay, slots.constants, slots.outer, slots.outputs
    pick = _picker(outs)

    def branch(*outer: Any) -> tuple:
        values = list(constants)
        for j, s in outer_pairs:
            values[s] = outer[j]
        replay(values)
        return pick(values)

    branch.function = slots.function  # type: ignore[attr-defined]  # (see _bind_if)
    return branch


def _picker(slots: tuple[int, ...]) -> Callable[[list], tuple]:
    """``pick(values) -> tuple`` of those slots (itemgetter returns a bare value for one slot)."""
    if len(slots) == 1:
        (s,) = slots
        return lambda values: (values[s],)
    if not slots:
        return lambda values: ()
    return operator.itemgetter(*slots)


def _bind_if(then_run: Callable, else_run: Callable) -> Callable[..., tuple]:
    def if_(cond: Any, *outer: Any) -> tuple:
        return (then_run if _truth(cond) else else_run)(*outer)

    def choice() -> tuple:
        """``(test, then, else)`` for a body's ``ExecutionPlan.function``, which calls the branch it
        picks in place of ``if_``: each branch as its own generated function (built here, when the
        enclosing body's is: a top-level If runs once a run and never pays for one)."""
        return (_truth, _as_function(then_run), _as_function(else_run))

    if_.choice = choice  # type: ignore[attr-defined]
    return if_


def _as_function(run: Callable[..., tuple]) -> Callable[..., tuple]:
    """A branch's generated function (:meth:`_Slots.function`), else the branch itself."""
    make = getattr(run, "function", None)
    fn = make() if make is not None else None
    return fn if fn is not None else run


def _truth(v: Any) -> bool:
    """If's single-element condition (``item()`` of an array: the common case costs no reshape)."""
    if type(v) is np.ndarray:
        if v.size == 1:
            return bool(v.item())
    elif np.size(v) == 1:
        return bool(np.asarray(v).reshape(-1)[0])
    raise ValueError(f"If expects a single-element condition, got shape {list(np.shape(v))}")


def _bind_loop(body: Callable, n_in: int, n_carried: int, empties: tuple[np.ndarray, ...]) -> Callable[..., tuple]:
    n_scan = len(empties)

    def loop(trip: Any, cond: Any, *args: Any) -> tuple:
        carried, outer = list(args[:n_carried]), args[n_in - 2:]
        limit, it_dtype, keep_going, cond_value = _loop_start(trip, cond)
        scans: list[list] = [[] for _ in range(n_scan)]
        it = 0
        while keep_going and (limit is None or it < limit):
            out = body((np.array(it, dtype=it_dtype), cond_value, *carried), outer)
            cond_value = out[0]
            keep_going = _loop_more(cond_value)
            carried = out[1:1 + n_carried]
            for k in range(n_scan):
                scans[k].append(out[1 + n_carried + k])
            it += 1
        return (*carried, *(_stack(s, e) for s, e in zip(scans, empties)))

    return loop


def _bind_slot_loop(body: _Slots, n_in: int, n_carried: int, empties: tuple[np.ndarray, ...]) -> Callable[..., tuple]:
    """Loop over one slot list per call: the constants and outer-scope values are written once, each
    iteration writes the iteration number, the condition and the carried values into the body's input
    slots, replays, and reads the outputs' slots (every body node runs every iteration, so no slot is
    read before the iteration writes it; inputs, outputs, constants and outer values are never
    released by the body's plan)."""
    n_scan = len(empties)
    # the body as one generated function, built by the first call (a body whose Loop never runs, or a
    # session that never runs, pays nothing for it); two first calls at once may both build it
    function: list = []
    it_slot, cond_slot = body.inputs[0], body.inputs[1]
    carried_in = tuple((k, s) for k, s in enumerate(body.inputs[2:]) if s is not None)
    cond_out = body.outputs[0]
    carried_out = _picker(body.outputs[1:1 + n_carried])
    scan_out = body.outputs[1 + n_carried:]
    replay = body.replay

    def loop(trip: Any, cond: Any, *args: Any) -> tuple:
        if not function:
            fn = body.loop(n_in, n_carried, empties)
            if fn is None:
                fn = body.function(body.inputs)
                fn = _bind_function_loop(fn, n_in, n_carried, n_scan, empties) if fn is not None else None
            function.append(fn)
        if function[0] is not None:
            return function[0](trip, cond, *args)
        carried, outer = args[:n_carried], args[n_in - 2:]
        limit, it_dtype, keep_going, cond_value = _loop_start(trip, cond)
        scans: list[list] = [[] for _ in range(n_scan)]
        values = body.fresh(outer)
        it = 0
        while keep_going and (limit is None or it < limit):
            checkpoint()  # once per body evaluation: a Loop with a huge trip count honours cancel()
            if it_slot is not None:
                values[it_slot] = np.array(it, dtype=it_dtype)
            if cond_slot is not None:
                values[cond_slot] = cond_value
            for k, s in carried_in:
                values[s] = carried[k]
            replay(values)
            cond_value = values[cond_out]
            keep_going = _loop_more(cond_value)
            carried = carried_out(values)
            for k in range(n_scan):
                scans[k].append(values[scan_out[k]])
            it += 1
        return (*carried, *(_stack(s, e) for s, e in zip(scans, empties)))

    return loop


def _bind_function_loop(body: Callable[..., tuple], n_in: int, n_carried: int, n_scan: int,
                        empties: tuple[np.ndarray, ...]) -> Callable[..., tuple]:
    """Loop over the body as one function (:meth:`_Slots.function`): each iteration calls
    ``body(iteration, cond, *carried, *outer) -> (cond, *carried, *scan values)``."""
    carried_end = 1 + n_carried

    def loop(trip: Any, cond: Any, *args: Any) -> tuple:
        carried, outer = args[:n_carried], args[n_in - 2:]
        limit, it_dtype, keep_going, cond_value = _loop_start(trip, cond)
        scans: list[list] = [[] for _ in range(n_scan)]
        it = 0
        while keep_going and (limit is None or it < limit):
            checkpoint()  # once per body evaluation: a Loop with a huge trip count honours cancel()
            out = body(np.array(it, dtype=it_dtype), cond_value, *carried, *outer)
            cond_value = out[0]
            keep_going = _loop_more(cond_value)
            carried = out[1:carried_end]
            for k in range(n_scan):
                scans[k].append(out[carried_end + k])
            it += 1
        return (*carried, *(_stack(s, e) for s, e in zip(scans, empties)))

    return loop


def _loop_start(trip: Any, cond: Any) -> tuple:
    """A Loop's (trip limit or None, iteration dtype, whether to run the first iteration, condition):
    shared by the three drivers and the generated loop, so they agree on ONNX's optional trip count
    and condition."""
    limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    it_dtype = np.int64 if trip is None else np.asarray(trip).dtype
    keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    return limit, it_dtype, keep_going, np.array(True) if cond is None else cond


def _loop_more(cond_value: Any) -> bool:
    """Whether the Loop runs another iteration: the body's condition output, a single element."""
    return bool(cond_value.item() if type(cond_value) is np.ndarray and cond_value.size == 1
                else np.asarray(cond_value).reshape(-1)[0])


def _stack(values: list, empty: np.ndarray) -> np.ndarray:
    """A scan output: the iterations' values stacked on a new axis 0, ``empty`` after none."""
    return np.stack(values) if values else empty.copy()
