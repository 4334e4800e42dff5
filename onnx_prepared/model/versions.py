"""Refuse at load what the installed ``onnx`` cannot describe: IR versions, opsets and op versions
beyond the ones it knows (onnxruntime refuses them too; running them would guess at semantics)."""

from __future__ import annotations

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ModelLoadError, short
from onnx_prepared.model import schemas

#: Domains whose operator sets the installed onnx defines; custom domains (com.microsoft, ...) are the
#: kernels' business.
_ONNX_DOMAINS = {"": "", "ai.onnx": "", "ai.onnx.ml": "ai.onnx.ml"}


def max_opset(domain: str) -> int:
    """Highest opset of an onnx-defined ``domain`` the installed onnx knows."""
    return schemas.cache().max_opset(domain)


#: What the load's one walk read of a top-level node: ``(op_type, domain, name, inputs, outputs, attrs,
#: schema)``. ``attrs`` is the node's attributes as ``bind.attributes.parse_attributes`` returns them when
#: every one is a plain INT/FLOAT/INTS/FLOATS/STRING/STRINGS value or an inline TENSOR (converted by
#: ``to_array``) its schema declares (so the node holds no subgraph and no external tensor), else None (ask
#: the node). ``schema`` is None outside the onnx domains.
NodeFacts = tuple


def check_versions(model: onnx.ModelProto, what: str, facts: list | None = None) -> None:
    """Raise ModelLoadError naming the version if ``model`` needs a newer onnx than the installed one.

    ``facts``, when given, gets one :data:`NodeFacts` per node of ``model.graph`` (in order), read by the
    same walk, so later passes (type check, resolution) need not read the protobuf nodes again."""
    if model.ir_version < 1:  # unset (a truncated or damaged header): onnxruntime refuses it too
        raise ModelLoadError(f"{what} has no IR version (ir_version {model.ir_version}): not an ONNX model as "
                             f"written by an exporter")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(f"{what} has IR version {model.ir_version}; the installed onnx {onnx.__version__} "
                             f"knows IR versions up to {onnx.IR_VERSION}")
    opsets: dict[str, int] = {}
    for o in model.opset_import:
        dom = _ONNX_DOMAINS.get(o.domain)
        if dom is None:
            continue
        if o.version > max_opset(dom) or o.version < 1:
            raise ModelLoadError(f"{what} imports opset {o.version} of domain {o.domain or 'ai.onnx'!r}; the "
                                 f"installed onnx {onnx.__version__} knows opsets 1..{max_opset(dom)}")
        opsets[dom] = o.version
    local = {(f.domain, f.name) for f in model.functions}
    _check_nodes(model.graph.node, opsets, local, what, facts)
    for f in model.functions:
        fops = dict(opsets)
        for o in f.opset_import:
            dom = _ONNX_DOMAINS.get(o.domain)
            if dom is not None:
                fops[dom] = o.version
        _check_nodes(f.node, fops, local, what)


def _check_nodes(nodes, opsets: dict[str, int], local: set[tuple[str, str]], what: str,
                 facts: list | None = None) -> None:
    lookup = schemas.cache().lookup
    domains = _ONNX_DOMAINS
    stack = [iter(nodes)]
    while stack:  # iterative: subgraphs nest arbitrarily deep
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        op_type, domain = node.op_type, node.domain
        if type(op_type) is not str or type(domain) is not str:  # invalid UTF-8 -> bytes
            raise ModelLoadError(f"{what}: node {short(repr(node.name))} has an op_type or domain that is not "
                                 f"valid UTF-8")
        dom = domains.get(domain)
        attributes = node.attribute
        parsed = {} if facts is not None and len(stack) == 1 else None  # a node of the graph itself
        schema = None
        if dom is not None and dom in opsets and (not local or (domain, op_type) not in local):
            version = opsets[dom]
            try:
                schema = lookup(op_type, version, dom)
            except schemas.NotInOpset:
                _not_in_opset(node, dom, version, what)
            if schema is not None:  # None: not an onnx op at all: reported as unsupported by kernel choice
                # the check saw every attribute's set fields: the subgraphs come back from it
                ins = node.input  # read once (each access builds a wrapper); tuple() of an empty one is ~1 us
                ins = tuple(ins) if ins else ()  # (a Constant's)
                subgraphs = _check_signature(node, schema, what, attributes, parsed, len(ins))
                if parsed is not None:
                    facts.append((op_type, domain, node.name, ins, tuple(node.output),
                                  None if _UNPARSED in parsed else parsed, schema))
                if subgraphs:
                    stack.extend(iter(g.node) for g in subgraphs)
                continue
        for a in attributes:  # no schema: only the subgraphs (and, for the graph's nodes, the values) are read
            fields = a.ListFields()
            _check_bare_attribute(node, fields, what)
            for fd, v in fields:
                if fd is _G_FD:
                    stack.append(iter(v.node))
                elif fd is _GRAPHS_FD:
                    stack.extend(iter(g.node) for g in v)
            if parsed is not None:
                _parse_plain(a.name, fields, parsed)
        if parsed is not None:
            facts.append((op_type, domain, node.name, tuple(node.input), tuple(node.output),
                          None if _UNPARSED in parsed else parsed, schema))


def _check_bare_attribute(node, fields: list, what: str) -> None:
    """Refuse an attribute with no name or no type on a node without an onnx schema (com.microsoft and
    other domains), as onnxruntime's checker refuses it ("Field 'name' of 'attr' is required to be
    non-empty"); kernels read such an attribute as missing, or as None (a QGemm's type-less transB
    raised a bare TypeError in its prepack rule)."""
    name = a_type = None
    for fd, v in fields:
        if fd is _NAME_FD:
            name = v
        elif fd is _TYPE_FD:
            a_type = v
    if not name or not a_type:
        node_name = short(node.name or node.op_type)
        raise ModelLoadError(f"{what}: node {node_name!r} ({node.op_type}) has an attribute "
                             + (f"{short(name)!r} with no type" if name else "with no name"))


def _parse_plain(name: str, fields: list, parsed: dict) -> None:
    """``parsed[name]`` = the attribute's value as ``parse_attributes`` returns it, from its set
    ``fields`` (name, one plain value of its declared type, type); else the ``_UNPARSED`` mark."""
    if len(fields) == 3 and fields[2][0] is _TYPE_FD:
        want = fields[2][1]
        convert = _PLAIN.get(want)
        if convert is not None and fields[1][0] is _VALUE_FD.get(want):
            try:
                parsed[name] = convert(fields[1][1])
                return
            except UnicodeDecodeError:  # left to parse_attributes, as before
                pass
    parsed[_UNPARSED] = None


def _check_op(node: onnx.NodeProto, domain: str, version: int, what: str) -> None:
    try:
        schema = schemas.cache().lookup(node.op_type, version, domain)
    except schemas.NotInOpset:
        _not_in_opset(node, domain, version, what)
    if schema is not None:  # None: not an onnx op at all: reported as unsupported by kernel choice
        _check_signature(node, schema, what)


def _not_in_opset(node: onnx.NodeProto, domain: str, version: int, what: str) -> None:
    """Raise the ModelLoadError for an op that opset ``version`` of ``domain`` does not define."""
    first = onnx.defs.get_schema(node.op_type, max_opset(domain), domain)
    while True:  # the earliest version, to say when the op appeared
        try:
            first = onnx.defs.get_schema(node.op_type, first.since_version - 1, domain)
        except onnx.defs.SchemaError:
            break
    raise ModelLoadError(
        f"{what}: node {short(node.name or node.op_type)!r} uses {node.op_type}, which opset {version} of "
        f"domain {domain or 'ai.onnx'!r} does not define (it first appears in opset {first.since_version})"
    ) from None


def _check_signature(node: onnx.NodeProto, schema: schemas.Schema, what: str, attributes=None,
                     parsed: dict | None = None, n_inputs: int | None = None) -> list:
    """Refuse a node whose input count or attribute types its schema does not allow.

    onnxruntime refuses such models; we would otherwise bind the inputs positionally and run something
    else (a Gemm missing A ran with A=B and B=C), or read an INT ``alpha`` as a float and compute with
    it: a result, but not the model's. An attribute the schema does not declare is refused too, as
    onnxruntime and onnx's checker refuse it: a misspelt ``transB`` would otherwise run with the default
    and give another result. A reference to a function's attribute (``ref_attr_name``) has no type of its
    own yet. ``attributes`` is ``node.attribute`` when the caller already has it. ``parsed``, when given,
    gets each plain attribute's value as ``parse_attributes`` returns it (and the key ``_UNPARSED`` when
    an attribute is not one of those: a tensor, a graph, a reference, or a value left at its default).

    ``n_inputs``: ``len(node.input)`` when the caller read the inputs already.

    Returns the subgraphs the node's attributes hold (``g`` and ``graphs``, whatever their declared type).
    """
    n = len(node.input) if n_inputs is None else n_inputs  # omitted optional inputs count, as in onnx's checker
    if n < schema.min_input or n > schema.max_input:
        name = short(node.name or node.op_type)
        allowed = (f"at least {schema.min_input}" if schema.max_input >= 2**31 - 1
                   else f"{schema.min_input}..{schema.max_input}")
        raise ModelLoadError(f"{what}: node {name!r} ({node.op_type}, opset {schema.since_version}) has {n} "
                             f"inputs; its schema allows {allowed}")
    declared_attrs = schema.attributes
    subgraphs: list = []
    for a in (node.attribute if attributes is None else attributes):
        # the common case from the set fields alone (one ListFields instead of reading name, type and
        # ref_attr_name one by one, each a wrapper): exactly name (1), the value field the declared type
        # uses, type (20); anything else (a reference, a doc string, a missing or foreign value field, an
        # undeclared name or another type) takes the general path below, which names what is wrong
        fields = a.ListFields()
        if len(fields) == 3:
            (name_fd, a_name), (value_fd, value), (type_fd, a_type) = fields
            declared = declared_attrs.get(a_name) if name_fd is _NAME_FD and type_fd is _TYPE_FD else None
            if declared is not None and declared[0] == a_type and value_fd is _VALUE_FD.get(a_type):
                if parsed is not None:
                    convert = _PLAIN.get(a_type)
                    try:
                        if convert is not None:
                            parsed[a_name] = convert(value)
                        elif a_type == _A.TENSOR and value.data_location != _EXTERNAL:
                            # an inline tensor (a Constant's value) as parse_attributes converts it: the
                            # node's attributes are not walked twice more (nested tensors, resolution)
                            parsed[a_name] = onnx.to_array(value)
                        else:  # a graph, or an external tensor (inlined later): the node is asked
                            parsed[_UNPARSED] = None
                    except Exception:  # left to parse_attributes, which raises what it raised before
                        parsed[_UNPARSED] = None
                if a_type == _A.GRAPH:
                    subgraphs.append(value)
                elif a_type == _A.GRAPHS:
                    subgraphs.extend(value)
                continue
        a_name = a.name
        declared = declared_attrs.get(a_name)
        if declared is None:
            name = short(node.name or node.op_type)
            if type(a_name) is not str:
                raise ModelLoadError(f"{what}: node {name!r} has an attribute name that is not valid UTF-8")
            raise ModelLoadError(f"{what}: node {name!r} ({node.op_type}, opset {schema.since_version}) has "
                                 f"attribute {short(a_name)!r}, which its schema does not declare")
        if a.ref_attr_name:
            if parsed is not None:
                parsed[_UNPARSED] = None
            if a.HasField("g"):
                subgraphs.append(a.g)
            subgraphs.extend(a.graphs)
            continue
        want, want_name = declared
        a_type = a.type
        if a_type != want:
            name = short(node.name or node.op_type)
            have = onnx.AttributeProto.AttributeType.Name(a_type) if a_type in _ATTR_TYPES else str(a_type)
            raise ModelLoadError(f"{what}: node {name!r} ({node.op_type}) attribute {short(a_name)!r} has type "
                                 f"{have}; its schema declares {want_name}")
        # the set fields (read above), in field number order: name (1), the value, type (20) is the
        # common case and needs no more checking
        if len(fields) == 3 and fields[1][0] is _VALUE_FD.get(want):
            if parsed is not None:
                convert = _PLAIN.get(want)
                try:
                    if convert is None:  # a tensor or a graph: the node is asked
                        parsed[_UNPARSED] = None
                    else:
                        parsed[a_name] = convert(fields[1][1])
                except UnicodeDecodeError:  # left to parse_attributes, as before
                    parsed[_UNPARSED] = None
            if want == _A.GRAPH:
                subgraphs.append(fields[1][1])
            elif want == _A.GRAPHS:
                subgraphs.extend(fields[1][1])
            continue
        if parsed is not None:
            parsed[_UNPARSED] = None
        for fd, v in fields:
            if fd is _G_FD:
                subgraphs.append(v)
            elif fd is _GRAPHS_FD:
                subgraphs.extend(v)
        mine = _VALUE_FIELDS.get(want)
        other = [fd.name for fd, _ in fields if fd.name in _VALUE_NAMES and fd.name != mine]
        if other:  # an INT attribute carrying ints would be read as i = 0: a result, not the model's
            name = short(node.name or node.op_type)
            raise ModelLoadError(f"{what}: node {name!r} ({node.op_type}) attribute {short(a_name)!r} of type "
                                 f"{want_name} sets field {other[0]!r}, which that type does not use")
    return subgraphs


_ATTR_TYPES = frozenset(onnx.AttributeProto.AttributeType.values())
_A = onnx.AttributeProto
#: attribute type -> the one value field it may set (onnx's checker refuses any other)
_VALUE_FIELDS = {_A.FLOAT: "f", _A.INT: "i", _A.STRING: "s", _A.TENSOR: "t", _A.GRAPH: "g",
                 _A.SPARSE_TENSOR: "sparse_tensor", _A.TYPE_PROTO: "tp", _A.FLOATS: "floats", _A.INTS: "ints",
                 _A.STRINGS: "strings", _A.TENSORS: "tensors", _A.GRAPHS: "graphs",
                 _A.SPARSE_TENSORS: "sparse_tensors", _A.TYPE_PROTOS: "type_protos"}
_VALUE_NAMES = frozenset(_VALUE_FIELDS.values())
#: attribute type -> the descriptor of its value field (identity compare on the common path)
_VALUE_FD = {t: onnx.AttributeProto.DESCRIPTOR.fields_by_name[n] for t, n in _VALUE_FIELDS.items()}
_G_FD, _GRAPHS_FD = _VALUE_FD[_A.GRAPH], _VALUE_FD[_A.GRAPHS]
_TYPE_FD = onnx.AttributeProto.DESCRIPTOR.fields_by_name["type"]
_EXTERNAL = onnx.TensorProto.EXTERNAL
_NAME_FD = onnx.AttributeProto.DESCRIPTOR.fields_by_name["name"]

#: parsed's marker key (no attribute name is None): an attribute the walk did not convert
_UNPARSED = None


def _ident(v):
    return v


def _decode(v: bytes) -> str:
    return v.decode("utf-8")


def _decode_all(v) -> list[str]:
    return [s.decode("utf-8") for s in v]


#: attribute type -> its set value as ``parse_attributes`` returns it (tensors and graphs: not converted)
_PLAIN = {_A.INT: _ident, _A.FLOAT: _ident, _A.INTS: list, _A.FLOATS: list, _A.STRING: _decode,
          _A.STRINGS: _decode_all}
