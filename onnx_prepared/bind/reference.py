"""The ``onnx.reference`` adapter: the one fallback path, with our patches to the reference ops.

Every standard op without a fast kernel runs here (control flow, sequence/optional ops, function-bodied
and context-dependent function ops, ``ai.onnx.ml``, ``ai.onnx.preview[.training]``, model-local
functions), so coverage is the whole op set ``onnx.reference`` knows. The path is named and counted
(:data:`FALLBACK_CALLS`), never silent.

Binding builds the op's ``OpRun`` instance once (attributes parsed, subgraphs turned into evaluators);
a call is then one ``_run`` with pre-built keyword arguments, not a graph evaluation. Outer-scope values
of If/Loop/Scan (the node's ``implicit_inputs``) arrive after the explicit inputs and are handed to the
op as its ``context``; ops with a body but no context (SequenceMap) get their body wrapped so it sees them.
Ops whose function body depends on input types (Gelu, GroupNormalization, ...) are instantiated on first
call, once per input type signature.

This module imports ``onnx.reference`` (tens of ms): only :mod:`onnx_prepared.bind.fallback_env` and
:func:`onnx_prepared.bind.kernel.bind_kernel` import it, when a node first needs the fallback.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpFunction, OpRun, RuntimeContextError
from onnx.reference.ops import _op
from onnx.reference.ops.op_if import If as _RefIf
from onnx.reference.ops.op_loop import Loop as _RefLoop

from onnx_prepared.bind.fallback_env import FALLBACK_CALLS, FallbackEnv, SubgraphFactory
from onnx_prepared.bind.reference_fixes import FIXES as SEMANTIC_FIXES
from onnx_prepared.scheduler.task import checkpoint

__all__ = ["FALLBACK_CALLS", "FallbackEnv", "SubgraphFactory", "bind_fallback"]

# NOTE: Scatter (opsets 9-10, deprecated) has no reference implementation; its semantics are exactly
# ScatterElements-11 without a reduction attribute.
_ALIASES = {("", "Scatter"): "ScatterElements"}


def no_log(*_args: Any) -> None:
    return None


def load_op_class(env: FallbackEnv, node: onnx.NodeProto, input_types: Sequence[onnx.TypeProto] | None = None
                  ) -> Callable:
    """:meth:`FallbackEnv.load`: the ``OpRun`` class (or factory) implementing ``node``."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if (node.domain, node.op_type) in env.function_protos:
        impl = env.functions[node.domain, node.op_type]
        return lambda n, rp: OpFunction(n, rp, impl=impl)
    if (domain, node.op_type) in PATCHES:
        return PATCHES[domain, node.op_type]
    if domain not in env.opsets:
        raise ValueError(f"domain {domain!r} is not in the model's opset imports {sorted(env.opsets)}")
    version = env.opsets[domain]
    op_type = _ALIASES.get((domain, node.op_type), node.op_type)
    if domain == "":
        from onnx.reference.ops import load_op

        if input_types is None:
            return load_op("", op_type, version, evaluator_cls=env.make_evaluator)
        return load_op("", op_type, version, node=node, input_types=list(input_types),
                       evaluator_cls=env.make_evaluator)
    if domain == "ai.onnx.ml":
        from onnx.reference.ops.aionnxml import load_op
    elif domain == "ai.onnx.preview.training":
        from onnx.reference.ops.aionnx_preview_training import load_op
    elif domain == "ai.onnx.preview":
        from onnx.reference.ops.aionnx_preview import load_op
    elif domain == "experimental":
        from onnx.reference.ops.experimental import load_op
    else:
        raise NotImplementedError(f"onnx.reference has no domain {domain!r} and the model defines no such "
                                  f"function (model functions: {sorted(env.function_protos)})")
    return load_op(domain, op_type, version)


def function_evaluators(protos: Mapping[tuple[str, str], onnx.FunctionProto]) -> dict:
    """Reference evaluators of model-local functions, built callee-first (any declaration order)."""
    done: dict[tuple[str, str], ReferenceEvaluator] = {}
    pending = dict(protos)
    while pending:
        n_before = len(pending)
        failure: tuple[tuple[str, str], Exception] | None = None
        for key, proto in list(pending.items()):
            try:
                done[key] = Evaluator(proto, functions=list(done.values()))
            except Exception as e:  # maybe a callee not built yet: retry once the others are
                failure = (key, e)
            else:
                del pending[key]
        if failure is not None and len(pending) == n_before:
            (domain, name), e = failure
            raise ValueError(f"model function {domain}::{name} cannot be built: {e}") from e
    return done


def bind_fallback(
    node: onnx.NodeProto,
    opsets: Mapping[str, int],
    functions: Mapping[tuple[str, str], onnx.FunctionProto],
    implicit: tuple[str, ...],
    env: FallbackEnv | None = None,
) -> Callable[..., tuple]:
    """A callable ``(*inputs, *implicit_values) -> tuple`` evaluating ``node`` with onnx.reference."""
    env = env or FallbackEnv(opsets, functions)
    domain = "" if node.domain == "ai.onnx" else node.domain
    key = f"{domain or 'ai.onnx'}::{node.op_type}"
    if domain == "" and node.op_type == "Scan" and env.opsets.get("", 0) < 9:
        return _bind_scan8(node, env, key, implicit)
    try:
        cls = env.load(node)
    except RuntimeContextError:
        return _ContextDependent(node, env, key, implicit)
    return _make_call(cls(node, env.run_params), key, len(node.input), implicit)


def _make_call(
    op: OpRun, key: str, n_in: int, implicit: tuple[str, ...], *, counted: bool = True
) -> Callable[..., tuple]:
    """The cheapest correct way to call ``op``: its ``_run`` with pre-built keyword arguments if possible.

    ``OpRun.run`` rebuilds the keyword arguments, logs and validates on every call; we do the first
    once here and keep only the output normalisation (:func:`_fix_outputs`, which also lets an empty
    optional, None, through).
    """
    counter = FALLBACK_CALLS if counted else collections.Counter()
    if type(op).run in _CHECK_ONLY_RUNS:
        # run() only validates dtypes and calls _run(*inputs): call _run directly (half the cost).
        _run_only = op._run

        def call_unchecked(*args):
            counter[key] += 1
            return _fix_outputs(_run_only(*args))

        return call_unchecked
    if type(op).run is not OpRun.run or op.has_linked_attribute:
        # The class customises run() (variadic Max/Min, linked attributes); keep its contract.
        run = op.run

        def call_run(*args):
            counter[key] += 1
            return run(*args)

        return call_run
    kwargs = {name: getattr(op, name) for name in op.attributes_names_}
    if op.has_subgraph:
        kwargs["attributes"] = None
    _run = op._run
    if op.need_context():  # If, Loop, Scan: outer-scope values go in as the op's context

        def call_with_context(*args):
            counter[key] += 1
            return _fix_outputs(_run(*args[:n_in], context=dict(zip(implicit, args[n_in:])), **kwargs))

        return call_with_context
    bodies = [name for name, v in kwargs.items() if hasattr(v, "output_names") and hasattr(v, "run")]
    if implicit and bodies:  # SequenceMap: a body without a context argument

        def call_scoped(*args):
            counter[key] += 1
            outer = dict(zip(implicit, args[n_in:]))
            kw = dict(kwargs)
            for name in bodies:
                kw[name] = _OuterScoped(kwargs[name], outer)
            return _fix_outputs(_run(*args[:n_in], **kw))

        return call_scoped
    if not kwargs:

        def call_plain(*args):
            counter[key] += 1
            return _fix_outputs(_run(*args))

        return call_plain

    def call_kw(*args):
        counter[key] += 1
        return _fix_outputs(_run(*args, **kwargs))

    return call_kw


# run() methods of onnx.reference's base classes that check dtypes and call ``_run(*inputs)``, nothing else.
_CHECK_ONLY_RUNS = frozenset({_op.OpRunUnary.run, _op.OpRunUnaryNum.run, _op.OpRunBinary.run, _op.OpRunBinaryNum.run})


def _fix_outputs(res: tuple) -> tuple:
    """OpRun's output contract, minus its per-call validation: a tuple, scalars as 0-d arrays."""
    for x in res:
        if type(x) is not np.ndarray:
            return tuple(np.array(x) if np.isscalar(x) else x for x in res)
    return res


class _OuterScoped:
    """A subgraph evaluator that also sees the enclosing scope's values (inner names shadow outer)."""

    __slots__ = ("_ev", "_outer")

    def __init__(self, ev: ReferenceEvaluator, outer: dict):
        self._ev = ev
        self._outer = outer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ev, name)

    def run(self, output_names, feeds, attributes=None, **kwargs):
        return self._ev.run(output_names, {**self._outer, **feeds}, attributes=attributes, **kwargs)


class _ContextDependent:
    """An op whose function body depends on its input types: one bound call per type signature."""

    def __init__(self, node: onnx.NodeProto, env: FallbackEnv, key: str, implicit: tuple[str, ...]):
        self._node = node
        self._env = env
        self._key = key
        self._implicit = implicit
        self._n_in = len(node.input)
        self._calls: dict[tuple, Callable[..., tuple]] = {}

    def __call__(self, *args):
        explicit = args[: self._n_in]
        sig = tuple(_type_key(a) for a in explicit)
        call = self._calls.get(sig)
        if call is None:
            types = [_type_proto(a) for a in explicit]
            cls = self._env.load(self._node, types)
            call = _make_call(cls(self._node, self._env.run_params), self._key, self._n_in, self._implicit)
            self._calls[sig] = call  # racing first calls build equal entries; last write wins
        return call(*args)


def _type_key(v: Any) -> tuple | None:
    if v is None:
        return None
    if isinstance(v, list):
        return ("seq", _type_key(v[0]) if v else None)
    a = np.asarray(v)
    return (a.dtype.str, a.ndim)


def _type_proto(v: Any) -> onnx.TypeProto:
    """Element type and rank of a runtime value (dims left symbolic: bodies may not depend on them)."""
    if v is None:
        return onnx.TypeProto()
    if isinstance(v, list):
        return helper.make_sequence_type_proto(_type_proto(v[0]) if v else onnx.TypeProto())
    a = np.asarray(v)
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(a.dtype), [None] * a.ndim)


# **** onnx.reference fixes ****
# Subclasses named like the op they replace: bind_fallback uses them directly, and every evaluator we
# create (subgraphs, function bodies) gets them as ``new_ops``.


class Evaluator(ReferenceEvaluator):
    """ReferenceEvaluator with our fixes as default ``new_ops`` (propagates to nested subgraphs)."""

    def __init__(self, proto: Any, opsets=None, functions=None, verbose: int = 0, new_ops=None, **kwargs: Any):
        super().__init__(proto, opsets=opsets, functions=functions, verbose=verbose,
                         new_ops=new_ops or list(PATCHES.values()), **kwargs)


class Optional(OpRun):
    """An optional is its value or None, as onnxruntime and onnx's test data have it.

    The reference wraps the value in a one-element list, which then reaches the graph outputs
    (test_if_opt) and makes OptionalHasElement report an empty optional as present.
    """

    op_domain = ""

    def run(self, x=None, **_kwargs):
        return (x,)

    def _run(self, x=None, type=None):
        return (x,)


class Loop(_RefLoop):
    """Loop whose scan outputs stack along a new axis 0 (the reference's vstack gives [n, 1] for
    scalar and [n*a, b] for matrix per-iteration values: test_range_*_expanded)."""

    op_domain = ""

    def _run(self, M, cond, *args, context=None, body=None, attributes=None, bindings=None):
        body = self.body
        names_in = body.input_names
        inputs = dict.fromkeys(names_in)
        for name, val in zip(names_in[2:], args):
            inputs[name] = val
        if context is not None:
            inputs.update({k: v for k, v in context.items() if k not in inputs})
        scanned: list[list] = [[] for _ in range(self.K)]
        it = 0
        outputs = None
        while (cond is None or bool(cond)) and (M is None or it < M):
            checkpoint()  # cancel() reaches a huge trip count between iterations
            if names_in[0]:
                inputs[names_in[0]] = np.array(it, dtype=np.int64 if M is None else M.dtype)
            if len(names_in) > 1 and names_in[1]:
                inputs[names_in[1]] = cond
            outputs = self._run_body(inputs, attributes=attributes, bindings=bindings)
            for k in range(self.K):
                scanned[k].append(outputs[1 + self.N + k])
            cond = outputs[0]
            for name, value in zip(names_in[2:], outputs[1 : 1 + self.N]):
                inputs[name] = value
            it += 1
        final = [inputs[n] for n in names_in[2:]] if outputs is None else list(outputs[1 : 1 + self.N])
        final.extend(np.stack(s) if s else np.empty((0,), dtype=np.float32) for s in scanned)
        return tuple(final)


def _bind_scan8(node: onnx.NodeProto, env: FallbackEnv, key: str, implicit: tuple[str, ...]) -> Callable:
    """Scan-8 as Scan-9 per batch element: its values carry a leading batch axis and an optional
    ``sequence_lens`` first input (the reference only implements Scan-9+: test_scan_sum)."""
    from onnx.reference.ops.op_scan import Scan

    inner = onnx.NodeProto()
    inner.CopyFrom(node)
    del inner.input[0]
    for a in inner.attribute:
        if a.name == "directions":
            a.name = "scan_input_directions"
    call9 = _make_call(Scan(inner, env.run_params), key, len(inner.input), implicit, counted=False)
    n = len(inner.input)

    def call(seq_lens, *args):
        FALLBACK_CALLS[key] += 1
        explicit, outer = args[:n], args[n:]
        length = explicit[-1].shape[1]
        if seq_lens is not None and np.any(np.asarray(seq_lens) != length):
            raise NotImplementedError("Scan-8 with sequence_lens shorter than the scanned axis")
        per_batch = [call9(*(a[b] for a in explicit), *outer) for b in range(explicit[0].shape[0])]
        return tuple(np.stack([r[k] for r in per_batch]) for k in range(len(per_batch[0])))

    return call


class If(_RefIf):
    """If whose branch may return an empty optional (None); the reference rejects None outputs."""

    op_domain = ""

    def _run(self, cond, context=None, else_branch=None, then_branch=None, attributes=None, bindings=None):
        if np.size(cond) != 1:
            raise ValueError(f"If expects a single-element condition, got shape {np.shape(cond)}")
        branch = self._run_then_branch if np.asarray(cond).item() else self._run_else_branch
        return tuple(branch(context, attributes=attributes, bindings=bindings))


class GlobalLpPool(OpRun):
    """Missing from onnx.reference: the p-norm over all spatial axes, kept as size-1 axes."""

    op_domain = ""

    def _run(self, x, p=None):
        axes = tuple(range(2, x.ndim))
        p = 2 if p is None else p
        return ((np.sum(np.abs(x) ** p, axis=axes, keepdims=True) ** (1.0 / p)).astype(x.dtype),)


PATCHES: dict[tuple[str, str], type[OpRun]] = {
    ("", "Optional"): Optional, ("", "Loop"): Loop, ("", "If"): If, ("", "GlobalLpPool"): GlobalLpPool,
    **SEMANTIC_FIXES,  # ops where the reference's values differ from onnxruntime's (reference_fixes.py)
}
