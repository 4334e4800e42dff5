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

import functools
import operator
from collections.abc import Callable, Sequence

import numpy as np

from onnx_prepared.bind.kernel import BoundKernel
from onnx_prepared.errors import KernelError
from onnx_prepared.records import field, record, replace

#: Slot that reads as None (omitted optional inputs; omitted outputs are written here and cleared).
NONE_SLOT = 0

#: Full replays a plan runs through the step loop before it compiles its straight-line replay
#: (:func:`_compile`): the first run and a graph replayed once never pay for the compilation.
COMPILE_AFTER = 2


@record(frozen=True, slots=True)
class ExecuteAction:
    """Run one node, then release the slots whose last reader it was."""

    node_index: int
    kernel: BoundKernel
    inputs: tuple[int, ...]  # explicit inputs, then the kernel's implicit (outer-scope) inputs
    outputs: tuple[int, ...]
    release: tuple[int, ...]


@record(frozen=True, slots=True)
class ExecutionPlan:
    """Slots, constants and the ordered action list of one graph (immutable; shared by runs)."""

    slot_names: tuple[str, ...]
    input_slots: tuple[int, ...]  # graph inputs, in graph order (initializer-backed defaults excluded)
    output_slots: tuple[int, ...]
    constant_slots: dict[str, int]  # initializer name -> slot
    actions: tuple[ExecuteAction, ...]
    node_labels: Sequence[str]  # "name (op_type)" per node, for error messages (bind.graph.NodeLabels)
    # (slot, value) of Constant nodes computed once at binding (read-only); every run's slot list starts
    # with them (new_values), so they are no action at all
    presets: tuple[tuple[int, object], ...] = ()
    # per action, what replay unpacks and nothing else (derived from actions): see _step()
    steps: tuple[tuple, ...] = field(init=False, repr=False, compare=False)
    # the same steps without their releases, for step(): the caller sizes the outputs first
    held_steps: tuple[tuple, ...] = field(init=False, repr=False, compare=False)
    # [full replays so far, the compiled replay or None, the steps it was compiled from] (see replay(); a
    # benign race: two threads may both compile the same code)
    compiled: list = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        steps = tuple(_step(a) for a in self.actions)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "held_steps", tuple((*st[:5], (), st[6]) for st in steps))
        object.__setattr__(self, "compiled", [0, None, None])

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)

    def new_values(self) -> list:
        """A fresh per-run slot list: None, except the folded constants (``presets``)."""
        values = [None] * len(self.slot_names)
        for s, v in self.presets:
            values[s] = v
        return values

    def replay(
        self,
        values: list,
        start: int = 0,
        stop: int | None = None,
        *,
        on_release: Callable[[int], None] | None = None,
        on_step: Callable[[ExecuteAction, list], None] | None = None,
    ) -> None:
        """Execute actions ``[start, stop)`` (default: all) over ``values`` (a per-run slot list).

        This is the one kernel-call loop: the hot path replays everything, the cold path one action
        at a time. ``on_step(action, values)`` (after an action stored its outputs, before it releases
        anything: peak live memory) and ``on_release(slot)`` are for tests and diagnostics; they wrap
        the steps from outside (:func:`_observed_steps`), the loop itself stays bare. Thread-safe: the
        plan is read-only.
        """
        if start == 0 and stop is None and on_release is None and on_step is None:
            compiled = self.compiled
            fn = compiled[1]
            if compiled[2] is not self.steps:  # not compiled yet, or the steps were replaced (a profiler's)
                compiled[0] += 1
                if compiled[0] < COMPILE_AFTER:
                    return _run(self.steps, values, self)
                steps = self.steps
                fn = compiled[1] = _compile(steps)
                compiled[2] = steps
            try:
                fn(values)
            except Exception as e:
                act = self.actions[_failed_action(fn, e)]
                raise self.kernel_error(act, [values[i] for i in act.inputs], e) from e
            return None
        steps = self.steps if start == 0 and stop is None else self.steps[start:stop]
        if on_release is None and on_step is None:
            return _run(steps, values, self)
        steps, flush = _observed_steps(steps, values, on_step, on_release)
        _run(steps, values, self)
        flush()
        return None

    def step(self, values: list, pc: int) -> ExecuteAction:
        """Execute action ``pc`` over ``values`` *without* its releases; returns the action.

        The same loop as :meth:`replay`; the caller (``ExecutionFrame.step``) sizes the outputs, then
        clears ``action.release`` itself, so an output the action itself releases (an unused output,
        an omitted optional one in :data:`NONE_SLOT`) is still seen and counted.
        """
        _run(self.held_steps[pc:pc + 1], values, self)
        return self.actions[pc]

    def traced(self, after: Callable[[int], None]) -> ExecutionPlan:
        """A copy whose every action calls ``after(action_index)`` once its kernel returned: tracing
        wraps the plan from outside; replaying the copy runs the same loop."""
        acts = tuple(replace(a, kernel=replace(a.kernel, call=_reporting(a.kernel.call, i, after)))
                     for i, a in enumerate(self.actions))
        return replace(self, actions=acts)

    def function(self, params: Sequence[int | None], constants: Sequence) -> Callable[..., tuple] | None:
        """The whole plan as one function ``fn(*values) -> outputs tuple`` over local variables (a body
        a control-flow kernel calls per branch: no slot list to copy and fill, no replay call, no
        outputs picked from a list).

        ``params``: the slot each positional argument fills (None: an argument it ignores); a slot
        named twice takes the first. ``constants``, the kernels' ``choice``, releases, errors and None:
        as :meth:`body_code`. Thread-safe: the function holds no state."""
        code = self.body_code([(s, f"p{j}") for j, s in enumerate(params)], constants, "    ")
        if code is None:
            return None
        lines, glob, names = code
        args = [f"p{j}" if s is not None and names.get(s) == f"p{j}" else f"_{j}" for j, s in enumerate(params)]
        source = [f"def body({', '.join(args)}):", "  try:", *lines,
                  "  except Exception as e:", "    _failed(body, e, locals(), _names, 3)",
                  f"  return ({''.join(names.get(s, 'None') + ', ' for s in self.output_slots)})"]
        return self.make_function("body", source, glob, names)

    def body_code(self, args: Sequence[tuple[int | None, str]], constants: Sequence, indent: str
                  ) -> tuple[list[str], dict, dict[int, str]] | None:
        """The actions as Python lines over local variables, one line per action (its call, stores and
        releases), for :meth:`make_function`: ``(lines, the globals they read, slot -> expression)``.

        ``args``: (slot, variable) the caller binds (None: none; a slot named twice takes the first).
        ``constants``: a slot list (``new_values()`` with the initializers filled in) whose non-None
        entries the other slots read; a slot neither reads as None. A kernel with a ``choice``
        attribute (If), ``choice() -> (test, on_true, on_false)``, is called as the branch it picks,
        ``(on_true if test(c) else on_false)(*rest)``, which is what it computes. Releases clear the
        local as :meth:`replay` clears the slot. None when a node writes the slot of an argument or a
        constant (not valid ONNX; :meth:`replay` runs it)."""
        names: dict[int, str] = {NONE_SLOT: "None"}
        for s, var in args:
            if s is not None and s not in names:
                names[s] = var
        glob: dict = {"_failed": self._failed_in, "_names": names}
        for s, v in enumerate(constants):
            if v is not None and s not in names:
                names[s] = f"c{s}"
                glob[names[s]] = v
        if any(o in names and o != NONE_SLOT for a in self.actions for o in a.outputs):
            return None  # a node writes an argument's or a constant's slot: replay() keeps that case
        lines = []
        for i, a in enumerate(self.actions):
            ins = [names.get(j, "None") for j in a.inputs]
            choice = getattr(a.kernel.call, "choice", None)
            if choice is not None and ins:  # call(c, *rest) is (on_true if test(c) else on_false)(*rest)
                glob[f"q{i}"], glob[f"t{i}"], glob[f"f{i}"] = choice()
                call = f"(t{i} if q{i}({ins[0]}) else f{i})({', '.join(ins[1:])})"
            else:
                glob[f"k{i}"] = a.kernel.call
                call = f"k{i}({', '.join(ins)})"
            outs = a.outputs
            for o in outs:
                if o not in names:
                    names[o] = f"v{o}"
            if len(outs) == 1:
                stmts = [f"{names[outs[0]]} = {call}[0]" if outs[0] != NONE_SLOT else call]
            else:
                stmts = [f"r = {call}"] + [f"{names[o]} = r[{k}] if len(r) > {k} else None"
                                           for k, o in enumerate(outs) if o != NONE_SLOT]
            stmts += [f"{names[r]} = None" for r in a.release if names.get(r, "").startswith("v")]
            lines.append(indent + "; ".join(stmts))
        return lines, glob, names

    def make_function(self, name: str, source: list[str], glob: dict, names: dict[int, str]) -> Callable:
        """Compile ``source`` (a ``def name(...)`` holding :meth:`body_code`'s lines; cached by its text)
        with ``glob``. Its ``except Exception as e:`` calls ``_failed(name, e, locals(), _names, first)``,
        ``first`` the line number of action 0: :meth:`_failed_in` raises the KernelError naming the node
        (an error on another line propagates as it is)."""
        code = _replay_code("\n".join(source) + "\n", name).__code__
        fn = glob[name] = type(_compile)(code, glob, name)
        return fn

    def _failed_in(self, fn: Callable, e: BaseException, local: dict, names: dict[int, str], first: int) -> None:
        """Raise the KernelError of the action a :meth:`make_function` function raised in (line
        ``first + i`` of its code is action ``i``), with the inputs it was called with."""
        i = _failed_action(fn, e) + 2 - first
        if not 0 <= i < len(self.actions):
            raise e
        act = self.actions[i]
        glob = fn.__globals__
        args = [local[n] if n in local else glob.get(n) for n in (names.get(j, "None") for j in act.inputs)]
        raise self.kernel_error(act, args, e) from e

    def kernel_error(self, act: ExecuteAction, args: Sequence, e: BaseException) -> KernelError:
        """The user-facing error for a failed kernel: node, op, kernel and every input's dtype/shape."""
        sig = ", ".join(_describe(a) for a in args)
        return KernelError(f"node {self.node_labels[act.node_index]} [{act.kernel.name}] failed on inputs ({sig}): "
                           f"{type(e).__name__}: {e}")


def _run(steps: tuple, values: list, plan: ExecutionPlan) -> None:
    """The kernel-call loop (see ``_step`` for what each step unpacks)."""
    for call, n_in, arg, out, outs, rel, act in steps:
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
            raise plan.kernel_error(act, [values[i] for i in act.inputs], e) from e
        for slot in rel:
            values[slot] = None


def _compile(steps: tuple) -> Callable[[list], None]:
    """The whole step list as one straight-line function over the slot list: what :func:`_run` does
    per step (call, store, release), without unpacking a step, branching on its arity or looping over
    its releases (~0.1 us an action). Line ``i + 2`` of its code is action ``i`` (see
    :func:`_failed_action`); the code is cached by its text, so sessions of one model compile it once."""
    lines = ["def replay(v):"]
    for i, a in enumerate(st[6] for st in steps):
        call = f"k{i}({', '.join(f'v[{j}]' for j in a.inputs)})"
        if len(a.outputs) == 1:
            store = f"v[{a.outputs[0]}] = {call}[0]"
        else:
            store = f"store(v, {a.outputs!r}, {call})"
        lines.append("    " + "; ".join([store, *(f"v[{r}] = None" for r in a.release)]))
    fn = _replay_code("\n".join(lines) + "\n    return None\n")
    names = {f"k{i}": st[0] for i, st in enumerate(steps)}
    return type(_compile)(fn.__code__, {"store": _store, **names}, "replay")


def _store(values: list, slots: tuple[int, ...], res: Sequence) -> None:
    for slot, v in zip(slots, res):  # as _run: a kernel may return fewer values than the node has outputs
        values[slot] = v


@functools.lru_cache(maxsize=64)
def _replay_code(source: str, name: str = "replay") -> Callable[[list], None]:
    namespace: dict = {}
    exec(compile(source, "<onnx_prepared replay>", "exec"), namespace)
    return namespace[name]


def _failed_action(fn: Callable, e: BaseException) -> int:
    """The action a compiled replay raised in: the line of its frame in the traceback."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is fn.__code__:
            return tb.tb_lineno - 2
        tb = tb.tb_next
    raise e  # not raised inside the replay: nothing to attribute it to


def _reporting(call: Callable[..., tuple], index: int, after: Callable[[int], None]) -> Callable[..., tuple]:
    def reporting(*args):
        res = call(*args)
        after(index)
        return res

    return reporting


def _observed_steps(steps: tuple, values: list, on_step, on_release) -> tuple[tuple, Callable[[], None]]:
    """``steps`` with each action's releases deferred to the next call, so ``on_step`` sees its stored
    outputs before they happen; returns the steps and the flush to call after the last one."""
    pending: list = []

    def flush() -> None:
        if not pending:
            return
        act = pending.pop()
        if on_step is not None:
            on_step(act, values)
        for slot in act.release:
            values[slot] = None
            if on_release is not None:
                on_release(slot)

    def wrap(call, act):
        def observed(*args):
            flush()  # the previous action's step and releases (its outputs are stored by now)
            res = call(*args)
            pending.append(act)
            return res

        return observed

    return tuple((wrap(call, act), n_in, arg, out, outs, (), act)
                 for call, n_in, arg, out, outs, rel, act in steps), flush


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
