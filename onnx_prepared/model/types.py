"""Refuse at load nodes whose input element types their onnx schema's type constraints do not allow.

ONNX types each formal input with a type parameter (``T`` of Add, MatMul, Conv, Concat, ...): every
actual input bound to one parameter must have the same element type, and that type must be one the
constraint allows. onnxruntime refuses a model that breaks either rule ("Type parameter (T) of Optype
(Add) bound to different types"); we would instead let numpy promote (int64 + float32 -> float64) or
reinterpret bytes, and return a result that is not the model's. The check is generic: it reads the
schema's ``type_constraints`` and formal parameters, with no per-op code.

Element types are known for graph inputs and initializers, and are propagated through node outputs
whose formal type is a concrete tensor type or a type parameter bound by an input; everything else
(Cast's ``T2``, outputs of custom-domain ops, values of subgraphs) is unknown and not checked. Declared
``value_info`` is not trusted: it may be wrong, and onnxruntime infers rather than believes it.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ModelLoadError, short
from onnx_prepared.model import schemas

_NAMES = {v: f"tensor({k.lower()})" for k, v in onnx.TensorProto.DataType.items() if v}
_TENSOR_TYPES = frozenset(_NAMES.values())


def check_types(model: onnx.ModelProto, what: str, facts: list | None = None, weights: Mapping | None = None) -> None:
    """Raise ModelLoadError naming the node if an input's element type breaks its schema's constraints.

    Call after ``versions.check_versions`` (opsets and op versions are known to the installed onnx);
    ``facts``: the :data:`~onnx_prepared.model.versions.NodeFacts` it read of the graph's nodes, so
    they are not read from the protobuf again; ``weights``: the graph's initializer descriptors (name ->
    WeightDescriptor, all of them), read for their element types instead of the TensorProtos.
    """
    opsets = {{"ai.onnx": ""}.get(o.domain, o.domain): o.version for o in model.opset_import
              if o.domain in ("", "ai.onnx", "ai.onnx.ml")}
    g = model.graph
    types: dict[str, str] = {}
    for kind, values in (("input", g.input), ("output", g.output)):
        for vi in values:
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is not None and tt.elem_type and tt.elem_type not in _NAMES:  # 0: not stated
                raise ModelLoadError(f"{what}: graph {kind} {short(vi.name)!r} has element type {tt.elem_type}, "
                                     f"which onnx {onnx.__version__} does not define")
    for vi in g.input:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.elem_type:
            types[vi.name] = _NAMES[tt.elem_type]
    names = _NAMES
    if weights is not None and len(weights) == len(g.initializer):
        for name, d in weights.items():
            tn = names.get(d.elem_type)
            if tn is not None:
                types[name] = tn
    else:
        for t in g.initializer:
            tn = names.get(t.data_type)  # (each field read builds a wrapper: once)
            if tn is not None:
                types[t.name] = tn
    for t in g.sparse_initializer:
        if t.values.data_type in _NAMES:
            types[t.values.name] = _NAMES[t.values.data_type]
    if facts is not None and len(facts) == len(g.node):
        for op_type, _, name, ins, outs, _, schema in facts:
            if schema is not None:  # the op's schema at the model's opset (check_versions looked it up)
                _check_io(op_type, name, ins, outs, schema, types, what)
        return
    local = {(f.domain, f.name) for f in model.functions}
    lookup = schemas.cache().lookup
    for node in g.node:
        domain = node.domain
        dom = "" if domain == "ai.onnx" else domain
        version = opsets.get(dom)
        if version is None or (local and (domain, node.op_type) in local):
            continue
        try:
            schema = lookup(node.op_type, version, dom)
        except schemas.NotInOpset:
            continue  # versions.check_versions reports it
        if schema is not None:  # None: not an onnx op (kernel choice reports it)
            _check_node(node, schema, types, what)


def _check_node(node: onnx.NodeProto, schema: schemas.Schema, types: dict[str, str], what: str) -> None:
    _check_io(node.op_type, node.name, tuple(node.input), tuple(node.output), schema, types, what)


def _check_io(op_type: str, node_name: str, inputs: tuple[str, ...], outputs: tuple[str, ...],
              schema: schemas.Schema, types: dict[str, str], what: str) -> None:
    facts = _FACTS.get(schema)
    if facts is None:
        facts = _FACTS[schema] = _Facts(schema)
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (element type, first input name bound to it)
    names = inputs
    for name, tp in zip(names, facts.positions(len(names), False)):
        if tp is None or not name:
            continue
        have = types.get(name)
        if have is None:
            continue
        first = bound.get(tp)
        if first is None:
            ok = facts.restricts.get(tp)
            if ok is not None and have not in ok:
                raise ModelLoadError(
                    f"{what}: node {short(node_name or op_type)!r} ({op_type}, opset "
                    f"{schema.since_version}) input {short(name)!r} has type {have}, which type parameter "
                    f"{tp} does not allow ({', '.join(sorted(s for s in ok if s.startswith('tensor(')))})")
            bound[tp] = (have, name)
        elif first[0] != have:
            raise ModelLoadError(
                f"{what}: node {short(node_name or op_type)!r} ({op_type}, opset {schema.since_version}): "
                f"type parameter {tp} is bound to different types: {first[0]} (input {short(first[1])!r}) and "
                f"{have} (input {short(name)!r})")
    static = facts.static
    names = outputs
    for name, tp in zip(names, facts.positions(len(names), True)):
        if tp is None or not name:
            continue
        b = bound.get(tp)
        t = b[0] if b is not None else static.get(tp)
        if t is not None:
            types[name] = t
        else:
            types.pop(name, None)  # unknown (a later producer of the same name must not inherit a stale type)


class _Facts:
    """What :func:`_check_node` reads of one schema, derived once per process (a pure function of it).

    ``inputs``/``outputs``: (type parameter per fixed formal, None where unchecked; the variadic tail's
    parameter, None for none or a heterogeneous one; whether names past the fixed formals bind to the
    tail). ``restricts``: type parameter -> allowed tensor types, where the constraint names any.
    ``static``: type parameter -> the element type an output bound to it has when no input binds it.
    """

    __slots__ = ("_positions", "inputs", "outputs", "restricts", "static")

    def __init__(self, schema: schemas.Schema) -> None:
        allowed = schema.constraints
        self.inputs = _signature(schema.inputs, allowed)
        self.outputs = _signature(schema.outputs, None)
        self.restricts = {tp: ok for tp, ok in allowed.items() if any(s.startswith("tensor(") for s in ok)}
        static: dict[str, str] = {}
        for f in schema.outputs:
            tp = f.type_str
            only = allowed.get(tp, ())
            if tp in _TENSOR_TYPES:
                static[tp] = tp
            elif len(only) == 1 and next(iter(only)) in _TENSOR_TYPES:  # Shape's T1 is int64 only
                static[tp] = next(iter(only))
        self.static = static
        self._positions: dict[tuple[int, bool], tuple[str | None, ...]] = {}

    def positions(self, n: int, outputs: bool) -> tuple[str | None, ...]:
        """The type parameter checked at each of ``n`` input (or output) positions, None where unchecked
        (a last variadic formal takes every remaining position; a heterogeneous one, Loop's ``V``, and
        positions past the formals check nothing)."""
        key = (n, outputs)
        got = self._positions.get(key)
        if got is None:
            fixed, tail, more = self.outputs if outputs else self.inputs
            got = tuple(fixed[i] if i < len(fixed) else (tail if more else None) for i in range(n))
            self._positions[key] = got
        return got


_FACTS: dict[schemas.Schema, _Facts] = {}


def _signature(formals, allowed) -> tuple[tuple[str | None, ...], str | None, bool]:
    """See :class:`_Facts`. With ``allowed`` (inputs), parameters outside the constraints are unchecked."""
    def keep(tp: str) -> str | None:
        return tp if allowed is None or tp in allowed else None

    if not formals:
        return (), None, False
    last = formals[-1]
    if not last.variadic:
        return tuple(keep(f.type_str) for f in formals), None, False
    # a heterogeneous variadic (Loop's ``V``) binds no common type
    return tuple(keep(f.type_str) for f in formals[:-1]), keep(last.type_str) if last.homogeneous else None, True
