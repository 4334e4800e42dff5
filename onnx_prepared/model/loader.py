"""Metadata-only model loading: parse the protobuf, describe every initializer, read no weight byte.

The ``.onnx`` file itself is read whole (graph, metadata and inline tensors live there); external data
files are only resolved and stat-ed, never opened (``tests/model/test_model_loader.py::test_load_opens_no_data_file``).
Every external entry is validated here (see :mod:`onnx_prepared.model.external`), so a reader never
sees an escaping location or an out-of-bounds range. Errors are :class:`ModelLoadError` (or its
subclass :class:`ExternalDataError`) naming the model path or the tensor and file, raised ``from None``
so no protobuf or numpy traceback is the top error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from google.protobuf.message import Error as ProtobufError

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ModelLoadError, short
from onnx_prepared.model import schemas
from onnx_prepared.model.descriptors import (
    ExternalPayload,
    InlinePayload,
    WeightDescriptor,
    elem_type_name,
    expected_nbytes,
)
from onnx_prepared.model.external import LocationResolver, external_payload
from onnx_prepared.model.nesting import graph_depth
from onnx_prepared.model.reader import ExternalDataReader
from onnx_prepared.model.safe_open import NotRegularFile, read_regular
from onnx_prepared.model.strings import invalid_string_field
from onnx_prepared.model.types import check_types
from onnx_prepared.model.versions import check_versions
from onnx_prepared.model.wire import scan_initializers
from onnx_prepared.records import field, record

__all__ = [
    "LoadedModel",
    "NestedExternal",
    "describe",
    "describe_model",
    "expected_nbytes",
    "inline_nested_external",
    "load_model",
    "load_model_bytes",
]


@record(frozen=True, slots=True)
class NestedExternal:
    """An external tensor outside ``graph.initializer``: a subgraph initializer, a node attribute or part
    of a sparse initializer. Validated like the others; ``inline_nested_external`` reads it on request."""

    where: str
    tensor: onnx.TensorProto
    desc: WeightDescriptor


@record(frozen=True)
class LoadedModel:
    """A parsed model whose external weights are described, not read.

    ``weights`` holds one descriptor per ``graph.initializer`` in graph order. External tensors found
    anywhere else (subgraphs, Constant attributes, sparse initializers) are in ``nested_external``;
    evaluators that read those protos directly need ``inline_nested_external`` first.
    """

    path: str
    base_dir: str
    model: onnx.ModelProto
    weights: Mapping[str, WeightDescriptor] = field(default_factory=dict)
    nested_external: tuple[NestedExternal, ...] = ()
    #: whether a node holds a subgraph attribute (If/Loop/Scan bodies), seen by the walk that describes
    #: nested tensors; None: not known. Resolution skips implicit-input walks when it is False.
    has_subgraphs: bool | None = None
    #: per node of ``model.graph`` as parsed, what the load's validation walk read of it
    #: (:data:`~onnx_prepared.model.versions.NodeFacts`); empty: not recorded (a ModelProto described in
    #: memory). Resolution reads these instead of the protobuf nodes; edit ``model`` and they are stale.
    node_facts: tuple = ()

    @property
    def graph(self) -> onnx.GraphProto:
        return self.model.graph

    @property
    def opsets(self) -> dict[str, int]:
        return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in self.model.opset_import}

    @property
    def functions(self) -> dict[tuple[str, str], onnx.FunctionProto]:
        return {(f.domain, f.name): f for f in self.model.functions}


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Parse ``path`` without loading external data and describe every initializer.

    >>> m = load_model("model.onnx")
    >>> m.weights["W"].payload
    ExternalPayload(file='/models/m/weights.bin', offset=0, length=16384, checksum=None)
    """
    path = os.fspath(path)
    try:
        data, _ = read_regular(path)
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {short(path, 400)!r}") from None
    except NotRegularFile as e:
        raise ModelLoadError(f"model path is a {e.kind}, not a regular file: {short(path, 400)!r}") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {short(path, 400)!r}: {e.strerror or e}") from None
    except ValueError as e:  # os refuses a path with an embedded NUL
        raise ModelLoadError(f"invalid model path {short(repr(path), 400)}: {e}") from None
    raw_lengths: list = []
    facts: list = []
    what = repr(short(path, 400))
    model = _parse(data, what, raw_lengths, facts, types=False)
    loaded = describe_model(model, os.path.dirname(os.path.abspath(path)), path=path,
                            raw_lengths=raw_lengths or None, node_facts=facts)
    check_types(model, what, facts, loaded.weights)
    return loaded


def load_model_bytes(data: bytes | bytearray | memoryview, base_dir: str | os.PathLike, *,
                     name: str = "<memory>") -> LoadedModel:
    """Like :func:`load_model` for a serialized model held in memory; external data resolves in ``base_dir``."""
    raw_lengths: list = []
    facts: list = []
    model = _parse(bytes(data), name, raw_lengths, facts, types=False)
    loaded = describe_model(model, os.fspath(base_dir), path=name, raw_lengths=raw_lengths or None, node_facts=facts)
    check_types(model, name, facts, loaded.weights)
    return loaded


def describe_model(model: onnx.ModelProto, base_dir: str | os.PathLike, *, path: str = "<memory>",
                   raw_lengths: list[int | None] | None = None, node_facts: list | None = None) -> LoadedModel:
    """Describe (and validate) every initializer of an already parsed ``model`` whose external data lives
    in ``base_dir``; reads no weight byte. ``path`` only names the model in errors and in the result.
    ``raw_lengths``: each initializer's ``raw_data`` length (None: absent) as :mod:`~onnx_prepared.model.wire`
    read it from the serialized bytes, so no payload is copied to be measured. ``node_facts``: what
    validation read of the graph's nodes (``_parse``), kept for resolution."""
    base_dir = os.path.abspath(os.fspath(base_dir))
    resolver = LocationResolver(base_dir)
    weights: dict[str, WeightDescriptor] = {}
    inits = model.graph.initializer
    if raw_lengths is not None and len(raw_lengths) != len(inits):
        raw_lengths = None
    for i, t in enumerate(inits):
        name = t.name
        if name in weights:
            raise ModelLoadError(f"duplicate initializer {short(name)!r} in {short(path, 400)!r}")
        weights[name] = describe(t, base_dir, resolver, model_path=path, name=name,
                                 raw_length=raw_lengths[i] if raw_lengths is not None else _ASK)
    subgraphs: list[bool] = []
    facts = tuple(node_facts) if node_facts and len(node_facts) == len(model.graph.node) else ()
    nested = tuple(
        NestedExternal(where, t, describe(t, base_dir, resolver, model_path=path, name=t.name or where))
        for where, t in _nested_tensors(model, subgraphs, facts)
        if t.data_location == onnx.TensorProto.EXTERNAL
    )
    return LoadedModel(path, base_dir, model, MappingProxyType(weights), nested, bool(subgraphs), facts)


def _parse(data: bytes, what: str, raw_lengths: list | None = None, facts: list | None = None, *,
           types: bool = True) -> onnx.ModelProto:
    """``what`` names the source in errors (a quoted path, or ``<memory>``). ``raw_lengths``, when given,
    gets each initializer's raw_data length where the wire scan (:func:`_inline_weights`) ran; ``facts``
    the validation walk's :data:`~onnx_prepared.model.versions.NodeFacts` of the graph's nodes.
    ``types=False``: the element-type check is the caller's (after describing the initializers, whose
    descriptors it reads instead of the TensorProtos)."""
    if not data:
        raise ModelLoadError(f"model file is empty: {what}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (ProtobufError, RuntimeError, ValueError, TypeError) as e:
        depth = graph_depth(data)
        if depth is not None and depth > 16:
            raise ModelLoadError(f"{what} nests subgraphs {depth} levels deep, beyond protobuf's recursion limit "
                                 f"(100 nested messages, about 33 levels of If/Loop/Scan)") from None
        raise ModelLoadError(f"malformed ONNX protobuf in {what} (truncated or not an ONNX model): {e}") from None
    if not model.HasField("graph"):
        raise ModelLoadError(f"{what} is not an ONNX model (no graph)")
    # opset_import (field 8) is serialized after the graph (field 7): a file cut right after the graph
    # still parses, and only this check notices (test_truncated_model_every_cut).
    if not model.opset_import and (model.ir_version == 0 or model.ir_version >= 3):
        raise ModelLoadError(f"{what} declares no opset_import (truncated file or not an ONNX model)")
    scanned = _inline_weights(model, data)
    if scanned is not None and raw_lengths is not None:
        raw_lengths.extend(scanned[0])
    bad = invalid_string_field(model, data=scanned[1] if scanned is not None else data)
    if bad is not None:  # protobuf hands invalid UTF-8 back as bytes; no later code must see them
        raise ModelLoadError(f"{what}: string field {bad} is not valid UTF-8")
    if not model.graph.output:  # onnxruntime's run() refuses it ("at least one output"): nothing to compute
        raise ModelLoadError(f"{what}: the graph declares no output")
    facts = facts if facts is not None else []
    check_versions(model, what, facts)
    if types:
        check_types(model, what, facts)
    schemas.cache().flush()  # the schema facts this model looked up, for the next process
    return model


def _inline_weights(model: onnx.ModelProto, data: bytes) -> tuple[list[int | None], bytes] | None:
    """The wire scan of ``data`` (model/wire.py) where it pays: its Python loop visits every graph entry,
    while what it saves is a copy of the inline weights, so models whose bytes are mostly nodes (an LLM
    with external data) keep the plain path."""
    g = model.graph
    entries = len(g.node) + len(g.initializer) + len(g.value_info) + len(g.input) + len(g.output)
    if len(data) < _SCAN_BYTES_PER_ENTRY * (entries + 64):
        return None
    return scan_initializers(data)


#: serialized bytes per graph entry above which the wire scan is cheaper than the copies it avoids
_SCAN_BYTES_PER_ENTRY = 16384
_ASK = -1  # describe's raw_length default: read len(t.raw_data)


def describe(t: onnx.TensorProto, base_dir: str, resolver: LocationResolver | None = None, *,
             model_path: str | None = None, name: str | None = None,
             raw_length: int | None = _ASK) -> WeightDescriptor:
    """A validated descriptor for one tensor; raises ExternalDataError (external) or ModelLoadError (inline).

    ``name`` overrides ``t.name`` (nested tensors are often unnamed). ``raw_length``: the length of
    ``t.raw_data`` (None: not set) when the caller read it from the wire; by default it is asked of
    ``t`` (which copies the bytes).
    """
    name = name or t.name
    dims = t.dims  # int64s: protobuf hands back Python ints
    dims = tuple(dims) if dims else ()  # (a scalar's: tuple() of an empty container is ~1 us)
    data_type = t.data_type
    if t.data_location == _EXTERNAL:
        payload = external_payload(t, resolver or LocationResolver(base_dir), name, data_type=data_type, dims=dims)
        return WeightDescriptor(name, data_type, dims, payload)
    want = _INLINE_NBYTES.get(data_type)  # itemsize of a plain numeric type; None: ask expected_nbytes
    if want is not None and not t.HasField("segment"):
        n = want
        for d in dims:
            if d < 0:
                n = -1
                break
            n *= d
        if raw_length == _ASK:
            raw_length = len(t.raw_data) if t.HasField("raw_data") else None
        if n >= 0 and (raw_length is None or raw_length == n):
            return WeightDescriptor(name, data_type, dims, InlinePayload(t), n)
    where = f" in {short(model_path, 400)!r}" if model_path else ""
    if t.HasField("segment"):
        raise ModelLoadError(f"tensor {short(name)!r}{where} uses segments, which are not supported")
    try:
        want = expected_nbytes(data_type, dims)
    except ValueError as e:
        raise ModelLoadError(f"tensor {short(name)!r}{where}: {e}") from None
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"tensor {short(name)!r}{where} has a negative dimension: {list(dims)}")
    if t.HasField("raw_data") and len(t.raw_data) != want:
        kind = "STRING tensors cannot use raw_data" if want is None else f"raw_data holds {len(t.raw_data)} bytes"
        raise ModelLoadError(f"tensor {short(name)!r}{where}: {kind}; {elem_type_name(data_type)} x {list(dims)} "
                             f"needs {want} bytes")
    return WeightDescriptor(name, data_type, dims, InlinePayload(t))


_EXTERNAL = onnx.TensorProto.EXTERNAL
#: byte size per element of the plain numeric element types (describe's fast path; packed sub-byte
#: types, strings and the 8-bit float types go the general way)
_INLINE_NBYTES = {getattr(onnx.TensorProto, n): b for n, b in (
    ("FLOAT", 4), ("UINT8", 1), ("INT8", 1), ("UINT16", 2), ("INT16", 2), ("INT32", 4), ("INT64", 8),
    ("BOOL", 1), ("FLOAT16", 2), ("DOUBLE", 8), ("UINT32", 4), ("UINT64", 8), ("BFLOAT16", 2))}


# ---- tensors outside graph.initializer ----------------------------------------------------------


def _nested_tensors(model: onnx.ModelProto, subgraphs: list[bool], facts: tuple = ()
                    ) -> Iterator[tuple[str, onnx.TensorProto]]:
    """External tensors outside ``graph.initializer``; ``subgraphs`` gets an entry when a node holds a subgraph.
    ``facts``: the graph's NodeFacts; a node whose attributes they parsed holds no external tensor
    or graph."""
    g = model.graph
    for sp in g.sparse_initializer:
        yield f"sparse initializer {sp.values.name!r} values", sp.values
        yield f"sparse initializer {sp.values.name!r} indices", sp.indices
    nodes = g.node
    checked = ()
    if facts:
        nodes = [nodes[i] for i, f in enumerate(facts) if f[5] is None]
        checked = [f[6] is not None for f in facts if f[5] is None]
    yield from _node_tensors(nodes, "graph", subgraphs, checked)
    for fn in model.functions:
        yield from _node_tensors(fn.node, f"function {fn.domain}::{fn.name}", subgraphs)


_A = onnx.AttributeProto
#: attribute types that can carry a tensor (or a subgraph with tensors); every other type is skipped unread
_TENSOR_BEARING = frozenset({_A.UNDEFINED, _A.TENSOR, _A.TENSORS, _A.SPARSE_TENSOR, _A.SPARSE_TENSORS,
                             _A.GRAPH, _A.GRAPHS})
_FD = _A.DESCRIPTOR.fields_by_name
_T_FD, _TENSORS_FD, _G_FD, _GRAPHS_FD = _FD["t"], _FD["tensors"], _FD["g"], _FD["graphs"]
_SPARSE_FD, _SPARSES_FD = _FD["sparse_tensor"], _FD["sparse_tensors"]


def _node_tensors(nodes, scope: str, subgraphs: list[bool], checked=()) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Tensors held by node attributes and subgraphs, named by where they sit. Attributes are filtered by
    their declared type first (UNDEFINED kept: old files leave it unset): most nodes carry only ints and
    floats, and reading every field of those (and spelling out the place) cost ~70 us per node. A value
    set under another type's field is refused by the signature check (versions._check_signature).
    Only external tensors are yielded (all the caller keeps), so an inline Constant's place is never
    spelt out. ``checked[i]``: node ``i``'s attributes passed the signature check against its schema, so
    a TENSOR attribute sets ``t`` alone (read directly: a Constant's ListFields was ~1 us)."""
    for i, node in enumerate(nodes):
        schema_checked = i < len(checked) and checked[i]
        for a in node.attribute:
            a_type = a.type
            if a_type not in _TENSOR_BEARING:
                continue
            if a_type == _A.TENSOR and schema_checked:
                t = a.t
                if t.data_location == _EXTERNAL:
                    yield f"{scope} > node {node.name or node.op_type!r} attribute {a.name!r}", t
                continue
            here = None
            inner = []
            subs = []
            for fd, v in a.ListFields():  # the set fields in one call (a Constant's: name, t, type)
                if fd is _T_FD:
                    inner.append(("", v))
                elif fd is _TENSORS_FD:
                    inner.extend(("", t) for t in v)
                elif fd is _SPARSE_FD or fd is _SPARSES_FD:
                    for sp in ((v,) if fd is _SPARSE_FD else v):
                        inner += ((" values", sp.values), (" indices", sp.indices))
                elif fd is _G_FD:
                    subs.append(v)
                elif fd is _GRAPHS_FD:
                    subs.extend(v)
            if subs:
                subgraphs.append(True)
            for suffix, t in inner:
                if t.data_location == _EXTERNAL:
                    here = here or f"{scope} > node {node.name or node.op_type!r} attribute {a.name!r}"
                    yield here + suffix, t
            for sub in subs:
                here = here or f"{scope} > node {node.name or node.op_type!r} attribute {a.name!r}"
                yield from ((f"{here} initializer", t) for t in sub.initializer)
                for sp in sub.sparse_initializer:
                    yield f"{here} sparse initializer values", sp.values
                    yield f"{here} sparse initializer indices", sp.indices
                yield from _node_tensors(sub.node, here, subgraphs)


def inline_nested_external(loaded: LoadedModel, reader: ExternalDataReader) -> int:
    """Read every nested external tensor into its proto's ``raw_data`` (as ``onnx.load`` would), so
    evaluators that read subgraph/attribute protos directly (``onnx.reference``) see plain tensors.

    Idempotent; returns how many tensors it inlined. Mutates ``loaded.model``: call it once, before
    sharing the model between threads.
    """
    done = 0
    for n in loaded.nested_external:
        t = n.tensor
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        assert isinstance(n.desc.payload, ExternalPayload)
        t.raw_data = reader.read_bytes(n.desc).tobytes()
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]
        done += 1
    return done
