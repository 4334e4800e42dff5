"""Model resolution before weight loading: LoadedModel -> frozen ResolvedModel, reading no weight byte.

Resolution applies the standard transformations (dead-node and dead-initializer elimination), binds
every node's kernel once (:mod:`onnx_prepared.bind`; a prepacked node gets its prepack rule's kernel),
binds constant inputs to prepared objects (a :class:`PreparedKey` per kernel request, identical
requests sharing one key) and freezes the minimal payload manifest. The plan, the runtime and
``inspect`` read the bindings stored here; nothing binds a node a second time.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind import BoundKernel, bind_kernel, graph_env, implicit_inputs_of
from onnx_prepared.errors import InternalError, ModelLoadError
from onnx_prepared.kernels import prepack as prepack_mod
from onnx_prepared.model import LoadedModel, WeightDescriptor
from onnx_prepared.model.descriptors import ExternalPayload, np_dtype
from onnx_prepared.options import PreparedModelPolicy
from onnx_prepared.records import field, record
from onnx_prepared.resolve.fusions import (
    forward_initializer_identities,
    fuse_conv_activation,
    fuse_conv_add,
    fuse_conv_batchnorm,
    fuse_dequantize_matmul,
    fuse_encoder,
    fuse_squeeze_excite,
)
from onnx_prepared.resolve.fusions_qdq import fuse_qdq
from onnx_prepared.resolve.fusions_silu import fuse_silu
from onnx_prepared.resolve.graph_index import GraphIndex
from onnx_prepared.resolve.keys import RAW, PreparedKey, lineage_digest
from onnx_prepared.resolve.manifest import ManifestEntry, PayloadManifest, Why
from onnx_prepared.resolve.rows import NodeView, RowTable, find_row_tables, row_capable, row_reshape
from onnx_prepared.resolve.rows import has_candidates as has_row_candidates


@record(frozen=True, slots=True)
class ReadPackedPayload:
    """Recipe: read the packed bytes from the companion prepared model (no source read, no prepack)."""

    name: str  # manifest entry name: "prepared/<key>"
    entry: Any  # the companion store's CacheEntry


@record(frozen=True, slots=True)
class ReadSourceAndPrepack:
    """Recipe: read the source payloads, prepack them (identity for raw objects), publish."""

    sources: tuple[str, ...]
    layout: str


Recipe = ReadPackedPayload | ReadSourceAndPrepack


@record(frozen=True, slots=True)
class PreparedRequirement:
    """One prepared object the plan must materialize, its sources and who consumes it.

    ``recipes`` are ordered cheapest first; ``active`` is the one resolution selected, the others stay
    dormant fallbacks. Every recipe publishes the same key, so consumers never depend on which ran.
    """

    key: PreparedKey
    sources: tuple[str, ...]
    spec: prepack_mod.PrepackSpec | None  # None: raw (read -> publish)
    consumers: tuple[int, ...]  # node indices, in graph order
    source_bytes: int
    recipes: tuple[Recipe, ...] = ()
    active: Recipe | None = None

    @property
    def cached(self) -> bool:
        return isinstance(self.active, ReadPackedPayload)

    @property
    def estimated_bytes(self) -> int:
        """Published size: what the prepack rule declares, else the sources' size."""
        if self.spec is not None and self.spec.packed_bytes is not None:
            return self.spec.packed_bytes
        return self.source_bytes


@record(frozen=True, slots=True)
class NodePrepack:
    key: PreparedKey
    spec: prepack_mod.PrepackSpec


@record(frozen=True, slots=True)
class ResolvedModel:
    """The frozen result of resolution: mutation raises ``FrozenInstanceError``.

    The transformed graph is ``graph_proto``, which nothing edits after resolution: the plan reads it
    (node names come from ``node_io``/``node_meta``; the proto gives the graph's inputs and outputs) and
    :meth:`graph` hands out copies, so no caller changes what the plan is built from. (It was kept
    serialized and parsed again by the plan: ~30 us of a 16-node CNN's construction.) Its top-level
    initializers carry their names only (their types, dims and payloads are manifest entries), and only in
    what :meth:`graph` returns: ``graph_proto`` holds none when ``initializer_names`` is recorded (the plan
    reads the names from there; adding ~50 names one message each was ~1 us a name).
    """

    source: LoadedModel
    graph_proto: onnx.GraphProto  # read-only by convention: graph() copies it
    opsets: Mapping[str, int]
    kernels: tuple[BoundKernel, ...]  # per node of the transformed graph: the one kernel binding
    requirements: tuple[PreparedRequirement, ...]
    node_prepacks: Mapping[int, NodePrepack]
    raw_inputs: Mapping[int, tuple[tuple[int, PreparedKey], ...]]  # node -> (input position, raw key)
    manifest: PayloadManifest
    removed_nodes: int
    dead_initializers: tuple[str, ...]
    policy: PreparedModelPolicy = PreparedModelPolicy.DISABLED  # the prepared-model policy resolution ran under
    node_count: int = 0  # nodes of the transformed graph (so `complete` needs no parse)
    #: per node of the transformed graph: (input names, output names), read once here so the plan need
    #: not read them from the protobuf again (empty: not recorded; the plan reads the graph)
    node_io: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    #: per node of the transformed graph: (name, domain, op_type), read once here (empty: not recorded)
    node_meta: tuple[tuple[str, str, str], ...] = ()
    #: the transformed graph's top-level initializer names, in its order (None: not recorded; the plan
    #: reads the graph)
    initializer_names: tuple[str, ...] | None = None
    index: Mapping[PreparedKey, int] = field(default_factory=lambda: MappingProxyType({}))  # key -> requirement
    #: whether every top-level initializer's payload is inline (no external data, so no row table)
    inline_payloads: bool = False
    #: source name -> its row table (read by rows until resident; resolve/rows.py)
    row_tables: Mapping[str, RowTable] = field(default_factory=lambda: MappingProxyType({}))
    #: per node, the bound kernel's name ("ai.onnx::Gemm-13", "prepacked:...", "fallback:..."): derived
    kernel_choices: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernel_choices", tuple(k.name for k in self.kernels))

    def graph(self, *, initializers: bool = True) -> onnx.GraphProto:
        """A fresh copy of the transformed graph; ``initializers=False``: without the top-level
        initializer names that ``initializer_names`` records (the plan's copy: it reads that tuple)."""
        g = onnx.GraphProto()
        g.CopyFrom(self.graph_proto)
        names = self.initializer_names
        if initializers and names and not g.initializer:
            add = g.initializer.add
            for name in names:
                add(name=name)
        return g

    @property
    def graph_bytes(self) -> bytes:
        """The transformed graph serialized (without the top-level initializer names ``graph`` adds)."""
        return self.graph_proto.SerializeToString()

    @property
    def functions(self) -> dict[tuple[str, str], onnx.FunctionProto]:
        return self.source.functions

    @property
    def complete(self) -> bool:
        """Every node has a kernel and every requirement's sources are active manifest entries."""
        if len(self.kernels) != self.node_count:
            return False
        active = self.manifest.active  # (a loop, not nested generators: the plan asks once per construction)
        for r in self.requirements:
            if isinstance(r.active, ReadPackedPayload):
                if r.active.name not in active:
                    return False
                continue
            for s in r.sources:
                if s not in active:
                    return False
        return True

    @property
    def missing_cache_entries(self) -> list[PreparedKey]:
        """Prepacked requirements without a compatible companion entry (what require_complete rejects)."""
        return [r.key for r in self.requirements if not r.key.is_raw and not r.cached]

    def requirement(self, key: PreparedKey) -> PreparedRequirement:
        return self.requirements[self.index[key]]


def resolve_model(model: LoadedModel, *, prepared: Any = None,
                  policy: PreparedModelPolicy | str = PreparedModelPolicy.DISABLED) -> ResolvedModel:
    """Resolve ``model`` metadata-only (no payload is read).

    ``prepared`` is the companion :class:`~onnx_prepared.prepared.cache.PreparedModelStore` (or None);
    a compatible entry activates the ReadPackedPayload recipe and leaves the source reads dormant.
    """
    sidecar = prepared.source_digest_of if prepared is not None else None
    graph = _skeleton(model.graph, model.weights)
    # Subgraph attributes are rare; without any, no node has implicit inputs and no pass asks again
    # (fusions only rewrite ops without subgraphs).
    subgraphs = model.has_subgraphs if model.has_subgraphs is not None else _has_subgraphs(graph)
    opsets = model.opsets  # (a dict built per access)
    env = graph_env(opsets, model.functions)  # one fallback state shared by the graph's nodes
    memo = env.outer_names_memo  # each body's outer names computed once for all the passes below
    implicit_of = (lambda node: implicit_inputs_of(node, memo)) if subgraphs else _no_implicit
    # the passes' one view of the nodes, kept true by them; from the load's facts (the skeleton copied
    # every node as it is)
    index = GraphIndex(graph, subgraphs=subgraphs, facts=model.node_facts)
    _check_inputs_defined(index, graph, model.weights)
    removed = _eliminate_dead_nodes(graph, implicit_of, index)
    weights = model.weights
    # the initializers the passes may fold and the prepack rules may pack: not one the caller may override
    fixed = _fixed_initializers(model)
    fuse_dequantize_matmul(graph, fixed, opsets, index)
    forward_initializer_identities(graph, fixed, index)
    fuse_qdq(graph, fixed, index)
    fuse_squeeze_excite(graph, fixed, index)
    fuse_conv_batchnorm(graph, fixed, index)
    fuse_conv_add(graph, fixed, index)
    fuse_conv_activation(graph, fixed, index)
    fuse_encoder(graph, fixed, index)
    fuse_silu(graph, fixed, index)
    if len(index.inputs) != len(graph.node):
        raise InternalError("a rewrite pass left the graph index stale")
    used = _used_names(graph, implicit_of, index)
    dead = tuple(sorted(n for n in weights if n not in used))
    live_inits = tuple(n for n in weights if n in used)  # graph() adds them back, by name alone (_skeleton)

    reqs: dict[PreparedKey, dict] = {}
    node_prepacks: dict[int, NodePrepack] = {}
    raw_inputs: dict[int, list[tuple[int, PreparedKey]]] = {}
    kernels: list[BoundKernel] = []
    node_attrs: list[dict | None] = []

    def require(key: PreparedKey, sources: tuple[str, ...], spec, node_idx: int) -> None:
        r = reqs.setdefault(key, {"sources": sources, "spec": spec, "consumers": []})
        if node_idx not in r["consumers"]:
            r["consumers"].append(node_idx)

    raw_keys: dict[str, PreparedKey] = {}

    def raw_key(name: str) -> PreparedKey:
        key = raw_keys.get(name)
        if key is None:
            key = raw_keys[name] = PreparedKey((name,), RAW, "cpu", _digest((name,), weights, sidecar))
        return key

    inputs_of, outputs_of, attributes = index.inputs, index.outputs, index.attributes
    domains, op_types, names = index.domains, index.op_types, index.names
    nodes = graph.node  # (indexed where a node is read: iterating builds a wrapper per node)
    for idx in range(len(inputs_of)):
        ins = inputs_of[idx]
        const_pos = [i for i, n in enumerate(ins) if n and n in weights]  # in input order
        attrs = attributes(idx)  # None: attribute references, only the fallback resolves them
        node_attrs.append(attrs)
        implicit = implicit_of(nodes[idx]) if subgraphs else ()
        spec = None
        if const_pos and attrs is not None:
            shapes = {}
            for i in const_pos:
                if fixed is not weights and ins[i] not in fixed:
                    continue  # an overridable default: read as it is (a raw requirement the feed replaces)
                d = weights[ins[i]]
                dtype_name = _numpy_name(d.elem_type)
                if dtype_name is not None:
                    shapes[i] = (d.dims, dtype_name)
            # the rules read the node's op type, domain and input names: the index's, not the protobuf's
            view = NodeView(op_types[idx], domains[idx], names[idx], ins, outputs_of[idx])
            spec = prepack_mod.match(view, attrs, frozenset(shapes), shapes)
        if spec is not None:
            sources = tuple(ins[i] for i in spec.source_inputs)
            key = PreparedKey(sources, spec.layout, "cpu", _digest(sources, weights, sidecar))
            require(key, sources, spec, idx)
            node_prepacks[idx] = NodePrepack(key, spec)
            # called as kernel(packed, *other inputs): the plan rewires the node's inputs to match
            kernels.append(BoundKernel(spec.kernel, f"prepacked:{spec.layout}", False))
            packed = spec.source_inputs
            const_pos = [i for i in const_pos if i not in packed]
        else:
            kernels.append(bind_kernel(nodes[idx], env, implicit=implicit, attrs=attrs,
                                       fields=(domains[idx], op_types[idx], len(outputs_of[idx]))))
        if const_pos or implicit:
            raws = []
            for i in const_pos:
                key = raw_key(ins[i])
                require(key, key.lineage, None, idx)
                raws.append((i, key))
            for name in implicit:
                if name in weights:
                    key = raw_key(name)
                    require(key, key.lineage, None, idx)
                    raws.append((-1, key))
            if raws:
                raw_inputs[idx] = raws
    # per node (input names, output names) and (name, domain, op_type), from the index's lists
    node_io = tuple(zip(index.inputs, index.outputs))
    node_meta = tuple(zip(index.names, index.domains, index.op_types))
    for o in graph.output:  # an initializer returned as a graph output
        if o.name in weights:
            require(raw_key(o.name), (o.name,), None, len(graph.node))

    requirements = []
    for k, v in reqs.items():
        sources = v["sources"]
        src = ReadSourceAndPrepack(sources, k.layout)
        recipes: tuple = (src,)
        entry = prepared.lookup(k) if prepared is not None and not k.is_raw else None
        if entry is not None:
            recipes = (ReadPackedPayload(k.slot_name, entry), src)
        nbytes = weights[sources[0]].nbytes if len(sources) == 1 else sum(weights[s].nbytes for s in sources)
        requirements.append(PreparedRequirement(k, sources, v["spec"], tuple(v["consumers"]), nbytes, recipes,
                                                recipes[0]))
    requirements = tuple(requirements)
    # the nodes as the rows pass reads them (op_type, domain, name, input, output), from the index's lists
    if has_row_candidates(weights, requirements):
        views = [NodeView(*m) for m in zip(index.op_types, index.domains, index.names, index.inputs, index.outputs)]
        row_tables, row_nodes = find_row_tables(views, node_attrs, weights, requirements,
                                                frozenset(index.graph_outputs))
    else:  # (no external table: no view of every node built for nothing)
        row_tables, row_nodes = {}, {}
    for idx, positions in row_nodes.items():
        k, node = kernels[idx], views[idx]
        if idx in node_prepacks:  # Gather, GatherBlockQuantized and Reshape have no prepack rule
            raise InternalError(f"row table consumer {node.name!r} is prepacked")
        call = (row_reshape(k.call, allowzero=int((node_attrs[idx] or {}).get("allowzero", 0))) if not positions
                else row_capable(k.call, positions, strict=node.op_type == "Gather"))
        kernels[idx] = BoundKernel(call, k.name, k.is_fallback, k.implicit_inputs)
    active: dict[str, ManifestEntry] = {}
    dormant: dict[str, ManifestEntry] = {}
    any_cached = False
    for r in requirements:
        if type(r.active) is ReadPackedPayload:  # (r.cached)
            any_cached = True
            active[r.active.name] = ManifestEntry(r.active.name, None, f"cached packed payload of {r.key}",
                                                  r.active.entry)
            continue
        reason = None  # one reason for all of the requirement's new entries (a prepack has up to 9 sources)
        for s in r.sources:
            if s not in active:
                if reason is None:
                    first = r.consumers[0]
                    reason = Why(r.key, node_meta[first] if first < len(node_meta) else None)
                rows = row_tables.get(s) if row_tables else None
                active[s] = (ManifestEntry(s, weights[s], reason) if rows is None
                             else ManifestEntry(s, weights[s], reason, rows=rows.describe()))
    for r in requirements if any_cached else ():
        if r.cached:
            for s in r.sources:
                if s not in active and s not in dormant:
                    dormant[s] = ManifestEntry(s, weights[s], f"dormant source of cached {r.key}")
    if len(kernels) != len(graph.node):
        raise InternalError("kernel binding missing for a node")
    return ResolvedModel(
        source=model,
        graph_proto=graph,
        opsets=MappingProxyType(dict(opsets)),
        kernels=tuple(kernels),
        requirements=requirements,
        node_prepacks=MappingProxyType(node_prepacks),
        raw_inputs=MappingProxyType({k: tuple(v) for k, v in raw_inputs.items()}),
        manifest=PayloadManifest(MappingProxyType(active), MappingProxyType(dormant)),
        removed_nodes=removed,
        node_count=len(graph.node),
        node_io=node_io,
        node_meta=node_meta,
        initializer_names=live_inits,
        index=MappingProxyType({r.key: i for i, r in enumerate(requirements)}),
        row_tables=MappingProxyType(row_tables),
        inline_payloads=_all_inline(weights),
        dead_initializers=dead,
        policy=policy if type(policy) is PreparedModelPolicy else PreparedModelPolicy(getattr(policy, "value", policy)),
    )


def _check_inputs_defined(index: GraphIndex, graph: onnx.GraphProto, weights: Mapping[str, Any]) -> None:
    """Refuse a node input that no graph input, initializer or node output defines, before any pass
    rewrites the graph: onnxruntime refuses such a model ("is not a graph input, initializer, or output
    of a previous node"), and a pass that folds the node away (a QDQ bias's DequantizeLinear, whose
    scale the fused Conv derives) or dead-node elimination would otherwise run it as if it were valid.
    The plan's topological sort checks the rewritten graph again (bind/graph.py)."""
    defined = set(weights)
    defined.update(i.name for i in graph.input)
    for outs in index.outputs:
        defined.update(outs)
    for idx, ins in enumerate(index.inputs):
        for n in ins:
            if n and n not in defined:
                raise ModelLoadError(f"node {index.names[idx]!r} ({index.op_types[idx]}) reads {n!r}, which "
                                     f"nothing produces (no graph input, initializer or node output)")


def _skeleton(src: onnx.GraphProto, weights: Mapping[str, WeightDescriptor] | None = None) -> onnx.GraphProto:
    """A copy of ``src`` without its top-level initializers: :func:`resolve_model` records the live ones'
    names (``ResolvedModel.initializer_names``; the weights dict holds them in graph order).

    Why: resolution and the plan read initializer names only (payloads, types and dims come through the
    manifest); copying/serializing embedded payloads was most of session creation (resnet18: 110 of
    200 ms), and reading each TensorProto's name, type and dims ~1 us an initializer more.
    Subgraph initializers stay whole inside their nodes (the subgraph evaluators read them).
    When ``weights`` (the graph's initializers) hold at most :data:`_COPY_WHOLE_BYTES` inline, the copy
    is one ``CopyFrom`` with the initializers then cleared (the same message; ``ClearField``, where
    ``del g.initializer[:]`` cost ~0.45 us an initializer: 22 of 47 us on a 48-initializer QOperator CNN).
    """
    g = onnx.GraphProto()
    if weights is not None and _inline_at_most(weights, _COPY_WHOLE_BYTES):
        g.CopyFrom(src)
        g.ClearField("initializer")
        return g
    for f, value in src.ListFields():
        if f.name == "initializer":
            continue
        if f.is_repeated:
            getattr(g, f.name).extend(value)
        elif f.type == f.TYPE_MESSAGE:
            getattr(g, f.name).CopyFrom(value)
        else:
            setattr(g, f.name, value)
    return g


#: inline initializer bytes up to which :func:`_skeleton` copies the whole graph in one call and clears
#: the initializers (small CNNs and RNNs: 7-12 us instead of 20-34 us of field-by-field copies); above
#: it, copying the payloads costs more than the per-field copies it saves
_COPY_WHOLE_BYTES = 64 << 10


def _inline_at_most(weights: Mapping[str, WeightDescriptor], limit: int) -> bool:
    """Whether the inline payloads of ``weights`` total at most ``limit`` bytes (stops once above)."""
    total = 0
    for d in weights.values():
        if type(d.payload) is not ExternalPayload:
            total += d.nbytes
            if total > limit:
                return False
    return True


def _fixed_initializers(model: LoadedModel) -> Mapping[str, WeightDescriptor]:
    """The initializers that are constants: from IR version 4 on, one the graph also lists as an input is
    only a default a run may override (onnxruntime's ``CanOverrideInitializer``: it neither folds nor
    prepacks it), so the rewrite passes and the prepack rules must not take its value; all of them for an
    older model (whose inputs list every initializer by convention) or one that lists none."""
    weights = model.weights
    if model.model.ir_version < 4:
        return weights
    inputs = model.graph.input
    overridable = {i.name for i in inputs if i.name in weights} if inputs else ()
    if not overridable:
        return weights
    return {k: v for k, v in weights.items() if k not in overridable}


def _all_inline(weights: Mapping[str, WeightDescriptor]) -> bool:
    """Whether no payload of ``weights`` is external (stops at the first that is)."""
    return all(type(d.payload) is not ExternalPayload for d in weights.values())


_NUMPY_NAMES: dict[int, str | None] = {}


def _numpy_name(elem_type: int) -> str | None:
    """The numpy dtype name of an element type prepack rules see (bool/int/uint/float, int4/uint4), else
    None; a pure function of the type, computed once per process (``dtype.name`` is a Python property)."""
    try:
        return _NUMPY_NAMES[elem_type]
    except KeyError:
        pass
    try:
        dt = np_dtype(elem_type)
        name = dt.name if dt.kind in "biuf" or dt.name in ("int4", "uint4") else None
    except Exception:
        name = None
    _NUMPY_NAMES[elem_type] = name
    return name


def _digest(sources: tuple[str, ...], weights: Mapping[str, WeightDescriptor], sidecar=None) -> str | None:
    """Lineage digest from external-data checksums, else trusted sidecar digests; None when unknown."""
    if sidecar is None:  # no companion: no trusted digest (source_checksum is None for every source)
        return None
    ds = [weights[s] for s in sources]
    checksums = [source_checksum(d, sidecar) for d in ds]
    return lineage_digest(checksums, sources, [f"{d.elem_type}:{list(d.dims)}" for d in ds])


def _no_implicit(node: onnx.NodeProto) -> tuple[str, ...]:
    return ()


def _has_subgraphs(graph: onnx.GraphProto) -> bool:
    """True when a node of ``graph`` holds a subgraph attribute (then nodes may have implicit inputs)."""
    for node in graph.node:
        for a in node.attribute:
            if a.type in (_GRAPH, _GRAPHS):
                return True
    return False


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def _used_names(graph: onnx.GraphProto, implicit_of=implicit_inputs_of, index: GraphIndex | None = None) -> set[str]:
    used: set[str] = set()
    for ins in (index.inputs if index is not None else (n.input for n in graph.node)):
        used.update(ins)
    if implicit_of is not _no_implicit:
        for node in graph.node:
            used.update(implicit_of(node))
    used.discard("")  # an omitted optional input
    return used | {o.name for o in graph.output} | {i.name for i in graph.input}


def _eliminate_dead_nodes(graph: onnx.GraphProto, implicit_of=implicit_inputs_of,
                          index: GraphIndex | None = None) -> int:
    """Drop nodes none of whose outputs reach a graph output; returns how many were dropped."""
    index = index if index is not None else GraphIndex(graph)
    needed = set(index.graph_outputs)
    nodes = graph.node
    ins_of, outs_of = index.inputs, index.outputs
    implicit = implicit_of is not _no_implicit
    keep = [False] * len(ins_of)
    for idx in range(len(ins_of) - 1, -1, -1):
        outs = outs_of[idx]
        if len(outs) == 1:
            o = outs[0]
            live = bool(o) and o in needed
        else:
            live = any(o in needed for o in outs if o)
        if live:
            keep[idx] = True
            needed.update(ins_of[idx])
            if implicit:
                needed.update(implicit_of(nodes[idx]))
    if all(keep):
        return 0
    # NOTE: a node list that is not topologically sorted could hide a live producer after its
    # consumer; such graphs are rare and keep every node.
    order_ok = _is_topological(graph, index)
    if not order_ok:
        return 0
    drop = [i for i, k in enumerate(keep) if not k]
    for i in reversed(drop):  # in place: the kept nodes are not copied
        del nodes[i]
    index.rewritten({}, drop)
    return len(drop)


def _is_topological(graph: onnx.GraphProto, index: GraphIndex) -> bool:
    """True when every node-produced input is produced by an earlier node."""
    node_outputs = {o for outs in index.outputs for o in outs if o}
    produced: set[str] = set()
    for node, ins, outs in zip(graph.node, index.inputs, index.outputs):
        reads = [n for n in ins if n] + list(implicit_inputs_of(node))
        if any(n in node_outputs and n not in produced for n in reads):
            return False
        produced.update(outs)
    return True


def source_checksum(d: WeightDescriptor, sidecar=None) -> str | None:
    """A trusted content digest of one source, or None (the entry is then unverifiable: a miss).

    An external tensor's digest is trusted only through ``sidecar`` (the companion's record of a read
    that hashed those bytes, valid while the data file keeps the stat fingerprint it had then); a
    sha256 the model records must agree with it, since it states what the producer wrote, not what the
    file holds now. An inline tensor's bytes are inside the ``.onnx`` (covered by the source model
    digest), so its sidecar digest needs no fingerprint.
    """
    side = sidecar(d.name) if sidecar is not None else None
    if d.is_external:
        c = d.payload.checksum
        c = c.strip().lower().removeprefix("sha256:") if c else None
        if c is not None and len(c) == 64 and side is not None and side != c:
            return None
    return side.removeprefix("sha256:") if side else None
