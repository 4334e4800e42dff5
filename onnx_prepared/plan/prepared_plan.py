"""PreparedExecutionPlan: one immutable, scope-aware graph of session and invocation tasks.

Session tasks read sources and prepack them into prepared objects (``publishes`` a
:class:`PreparedKey`); invocation tasks are ranges of the one compact action list (the frozen
``ExecutionPlan`` of :mod:`onnx_prepared.bind`, the only action list there is). An invocation step
depends on the step before it and on the session tasks that publish the prepared objects it consumes.
This is what runs: the runtime instantiates a generation's session tasks from these descriptors
(:meth:`PreparedExecutionPlan.generation_tasks`), and the cold path executes the invocation ranges.

The plan also precomputes what the cold path needs: one bit per prepared requirement, the bits each
action needs, the first and last action that needs each requirement (prefetch distance, unpin), and
the order inference first needs them in (the session tasks' order).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind import ExecutionPlan, build_execution_plan
from onnx_prepared.errors import InternalError, OnnxPreparedError
from onnx_prepared.model.descriptors import ExternalPayload
from onnx_prepared.options import PreparedModelPolicy
from onnx_prepared.records import field, record
from onnx_prepared.resolve import RAW, PreparedKey, PreparedRequirement, ResolvedModel


class PlanError(OnnxPreparedError):
    """The plan cannot be built from what was given (mutable/incomplete model, cycle, scope violation)."""


class TaskScope(enum.Enum):
    SESSION = "session"  # load, prepack, persist: once per generation
    INVOCATION = "invocation"  # node execution: once per run


class TaskKind(enum.Enum):
    READ_SOURCE = "read_source"
    PREPACK = "prepack"
    READ_PACKED = "read_packed"
    PUBLISH_RAW = "publish_raw"  # a raw object: its (possibly shared) source read, published as is
    PERSIST = "persist"
    EXECUTE = "execute"


@record(frozen=True, slots=True)
class TaskDescriptor:
    id: str
    scope: TaskScope
    kind: TaskKind
    resource: str  # "io" | "cpu" | "inline"
    dependencies: tuple[str, ...]
    prepared_requirements: tuple[PreparedKey, ...] = ()
    publishes: PreparedKey | None = None
    estimated_input_bytes: int = 0
    estimated_output_bytes: int = 0
    peak_temporary_bytes: int = 0
    actions: tuple[int, int] | None = None  # [start, stop) in the action list (invocation tasks)
    sources: tuple[str, ...] = ()  # payload names read (read tasks) or consumed (prepack tasks)
    result: str = ""  # human description for `inspect --plan`
    #: sources this (prepack or raw publish) task reads itself: small inline payloads, which get no read
    #: task of their own (:data:`SELF_READ_BYTES`)
    self_reads: tuple[str, ...] = ()


@record(frozen=True, slots=True)
class PreparedExecutionPlan:
    resolved: ResolvedModel
    tasks: tuple[TaskDescriptor, ...]
    execution: ExecutionPlan  # the compact action list that invocation tasks index into
    requirements: tuple[PreparedRequirement, ...]  # bit i = requirements[i]
    requirement_slots: tuple[int, ...]  # slot holding requirement i during a run
    action_requirements: tuple[tuple[int, ...], ...]  # per action: requirement bits it reads
    first_need: tuple[int, ...]  # per requirement: first action index that needs it
    last_need: tuple[int, ...]  # per requirement: last action index that needs it (unpin after it)
    need_positions: tuple[tuple[int, ...], ...]  # per requirement: every action index that reads it
    producer: Mapping[PreparedKey, str]  # key -> id of the session task that publishes it
    by_id: Mapping[str, TaskDescriptor]
    #: Requirements that are graph outputs (an initializer returned as is, perhaps read by no action):
    #: the cold path pins them after the last action and keeps them pinned to the end of the run.
    output_requirements: tuple[int, ...] = ()
    #: requirement bits in the order inference first needs them (the session tasks' order)
    need_order: tuple[int, ...] = ()
    #: key -> id of its PERSIST task (build_if_missing, a layout with bytes); not required by inference
    persister: Mapping[PreparedKey, str] = field(default_factory=lambda: MappingProxyType({}))
    #: key -> id of the READ_PACKED task restoring it from the entry this session persisted, after a
    #: residency budget evicted it (same id scheme as a companion hit: the restore is a packed read)
    restorer: Mapping[PreparedKey, str] = field(default_factory=lambda: MappingProxyType({}))

    def need_index(self, position: int) -> int:
        """Index in ``need_order`` of the first requirement first needed at or after ``position``."""
        firsts = self.first_need
        order = self.need_order
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if firsts[order[mid]] < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @property
    def session_tasks(self) -> tuple[TaskDescriptor, ...]:
        return tuple(t for t in self.tasks if t.scope is TaskScope.SESSION)

    @property
    def invocation_tasks(self) -> tuple[TaskDescriptor, ...]:
        return tuple(t for t in self.tasks if t.scope is TaskScope.INVOCATION)

    def next_need(self, bit: int, position: int) -> int:
        """Actions from ``position`` until requirement ``bit`` is next read, wrapping into the next run."""
        n = len(self.execution.actions)
        for p in self.need_positions[bit]:
            if p >= position:
                return p - position
        first = self.need_positions[bit]
        return (n - position + first[0]) if first else 2 * n

    def generation_tasks(self, key: PreparedKey, *, restore: bool = False) -> tuple[TaskDescriptor, ...]:
        """The session tasks one generation of ``key`` runs, dependencies first: its producer's closure
        (a companion read, or source reads and a prepack / raw publish), or its restore (a packed read
        of the entry this session persisted). The persist task is separate (:attr:`persister`)."""
        tid = self.restorer[key] if restore else self.producer[key]
        return tuple(self.by_id[t] for t in self.session_closure([tid]))

    def session_closure(self, task_ids: list[str]) -> list[str]:
        """Session tasks ``task_ids`` transitively depend on (including themselves), dependencies first."""
        seen: dict[str, None] = {}
        for t in task_ids:
            _visit(self.by_id, t, seen)
        return list(seen)

    def table(self) -> str:
        """The plan as the spec's table: task, scope, resource, dependencies, result."""
        rows = [("Task", "Scope", "Resource", "Dependencies", "Result")]
        for t in self.tasks:
            rows.append((t.id, t.scope.value, t.resource, ", ".join(t.dependencies) or "-", t.result))
        widths = [min(max(len(r[i]) for r in rows), 60) for i in range(4)]
        lines = []
        for r in rows:
            cells = [r[i].ljust(widths[i]) if len(r[i]) <= widths[i] else r[i][: widths[i] - 3] + "..."
                     for i in range(4)]
            lines.append("  ".join(cells + [r[4]]))
        return "\n".join(lines)


def build_prepared_plan(resolved: ResolvedModel, *, persist: bool | None = None) -> PreparedExecutionPlan:
    """BuildPreparedExecutionPlan: expand every requirement's recipe and merge it with the actions.

    ``persist``: whether the companion can be written now, i.e. PERSIST (and restore) descriptors are
    emitted; the session passes ``companion.writable``, so a build_if_missing companion in a folder
    found read-only at open plans no persist that would never run. None: from the policy alone
    (build_if_missing; what ``inspect --plan`` shows). A companion that degrades to read-only later,
    at a failed flush, leaves the plan as it is (the plan is immutable): its persists are then skipped.
    """
    if not isinstance(resolved, ResolvedModel):
        raise PlanError(f"a plan is built from a frozen ResolvedModel, not {type(resolved).__name__}")
    if not resolved.complete:
        raise PlanError("the resolved model is incomplete (a node without a kernel or a requirement "
                        "whose source is not an active manifest entry)")
    if resolved.policy is PreparedModelPolicy.REQUIRE_COMPLETE and resolved.missing_cache_entries:
        missing = resolved.missing_cache_entries
        raise PlanError(f"prepared_model_policy=require_complete: the companion model has no compatible entry "
                        f"for {len(missing)} prepared object(s): {', '.join(str(k) for k in missing[:10])}"
                        f"{' ...' if len(missing) > 10 else ''}")
    # the names: resolved.initializer_names; with every node's names recorded the plan only reads the
    # graph (its inputs and outputs, a Constant's node), else _build_actions rewires a copy's nodes
    recorded = len(resolved.node_io) == resolved.node_count and resolved.initializer_names is not None
    graph = resolved.graph_proto if recorded else resolved.graph(initializers=False)
    execution = _build_actions(resolved, graph)
    reqs = resolved.requirements
    slot_of = {n: i for i, n in enumerate(execution.slot_names)}
    req_slots = tuple(slot_of.get(_slot_name(r.key), -1) for r in reqs)
    slot_bit = {s: i for i, s in enumerate(req_slots) if s >= 0}
    action_reqs = tuple(tuple(sorted({slot_bit[s] for s in a.inputs if s in slot_bit})) for a in execution.actions)
    n_actions = len(execution.actions)
    need_positions: list[list[int]] = [[] for _ in reqs]
    for pos, bits in enumerate(action_reqs):
        for b in bits:
            need_positions[b].append(pos)
    first_need = [p[0] if p else n_actions for p in need_positions]
    last_need = [p[-1] if p else n_actions for p in need_positions]
    out_slots = set(execution.output_slots)
    output_bits = tuple(i for i, s in enumerate(req_slots) if s >= 0 and s in out_slots)
    for b in output_bits:  # a graph output is needed after every action: never unpinned mid-run
        last_need[b] = n_actions

    tasks: list[TaskDescriptor] = []
    producer: dict[PreparedKey, str] = {}
    read_task: dict[str, str] = {}
    manifest = resolved.manifest.active
    # Session tasks, ordered by when inference first needs them (what a sequential loader would do).
    order = sorted(range(len(reqs)), key=first_need.__getitem__)  # (stable: ties stay in requirement order)
    if persist is None:
        persist = resolved.policy is PreparedModelPolicy.BUILD_IF_MISSING
    persister: dict[PreparedKey, str] = {}
    restorer: dict[PreparedKey, str] = {}
    restores: list[TaskDescriptor] = []  # listed after the tasks a cold start runs
    session, read_source, publish_raw = TaskScope.SESSION, TaskKind.READ_SOURCE, TaskKind.PUBLISH_RAW
    owns: list[tuple[str, ...]] = [()] * len(reqs)  # per requirement: the sources its producer reads itself
    inline = resolved.inline_payloads
    for i in order:
        r = reqs[i]
        ks = str(r.key)  # (a join per use otherwise)
        if r.cached:
            tid = f"S.{ks}.read_packed"
            producer[r.key] = tid
            tasks.append(TaskDescriptor(
                tid, TaskScope.SESSION, TaskKind.READ_PACKED, "io", (), publishes=r.key,
                estimated_output_bytes=r.active.entry.length, sources=(r.active.name,), result=f"publish {ks}",
            ))
            continue
        one = len(r.sources) == 1
        own = owns[i] = _self_reads(r, manifest, inline)
        for s in r.sources:
            if s in read_task or s in own:
                continue
            d = manifest[s].descriptor
            tid = f"S.{s}.read_source"
            read_task[s] = tid
            tasks.append(TaskDescriptor(
                tid, session, read_source, "io" if d.is_external else "inline", (),
                estimated_output_bytes=r.source_bytes if one else d.nbytes, sources=(s,),
                result=f"source bytes of {s}",
            ))
        if r.key.layout == RAW:  # (is_raw)
            # A separate publish task, so the read can be shared with a prepack of the same tensor
            # (a tied embedding and LM head) while each object is published by its own task; a small
            # inline source is read by the publish itself.
            s = r.sources[0]
            tid = f"S.{s}.publish"
            producer[r.key] = tid
            tasks.append(TaskDescriptor(
                tid, session, publish_raw, "inline", () if own else (read_task[s],), publishes=r.key,
                estimated_output_bytes=r.source_bytes, sources=(s,), result=f"publish {ks}", self_reads=own,
            ))
            continue
        tid = f"S.{ks}.prepack"
        producer[r.key] = tid
        packed = r.estimated_bytes
        tasks.append(TaskDescriptor(
            tid, TaskScope.SESSION, TaskKind.PREPACK, "cpu",
            tuple(read_task[s] for s in r.sources if s not in own),
            publishes=r.key, estimated_input_bytes=r.source_bytes, estimated_output_bytes=packed,
            peak_temporary_bytes=packed, sources=r.sources, result=f"publish {ks}", self_reads=own,
        ))
        if persist and r.spec is not None and r.spec.to_bytes is not None:
            persister[r.key] = f"S.{ks}.persist"
            tasks.append(TaskDescriptor(
                persister[r.key], TaskScope.SESSION, TaskKind.PERSIST, "io", (tid,),
                estimated_input_bytes=packed, sources=(r.key.slot_name,),
                result="companion-model payload; not required by inference",
            ))
            restorer[r.key] = f"S.{ks}.read_packed"
            restores.append(TaskDescriptor(
                restorer[r.key], TaskScope.SESSION, TaskKind.READ_PACKED, "io", (), publishes=r.key,
                estimated_output_bytes=packed, sources=(r.key.slot_name,),
                result=f"restore {ks} (after eviction, from the entry persisted by {persister[r.key]})",
            ))
    tasks.extend(restores)
    # what starts a new invocation step: an object whose production is a read or a prepack of more than
    # small inline payloads (a raw inline constant, or a prepack of small inline sources alone, is quick)
    io_bits = {i for i, r in enumerate(reqs) if r.cached or (
        manifest[r.sources[0]].descriptor.is_external if r.key.is_raw else not owns[i])}
    meta = resolved.node_meta if len(resolved.node_meta) == resolved.node_count else None
    tasks.extend(_invocation_steps(execution, graph, reqs, action_reqs, producer, io_bits, meta))
    by_id = {t.id: t for t in tasks}
    if len(by_id) != len(tasks):
        raise InternalError("duplicate task id in plan")
    _validate(tasks, by_id)
    return PreparedExecutionPlan(
        resolved, tuple(tasks), execution, reqs, req_slots, action_reqs, tuple(first_need), tuple(last_need),
        tuple(tuple(p) for p in need_positions),
        MappingProxyType(producer), MappingProxyType(by_id), output_bits, tuple(order),
        MappingProxyType(persister), MappingProxyType(restorer),
    )


def _visit(by_id: dict[str, TaskDescriptor], tid: str, seen: dict[str, None]) -> None:
    """Add ``tid``'s session-scope dependencies to ``seen`` (dependencies first), then ``tid`` (a
    module function: a nested recursive closure is a reference cycle left to the cyclic collector)."""
    if tid in seen:
        return
    for d in by_id[tid].dependencies:
        if by_id[d].scope is TaskScope.SESSION:
            _visit(by_id, d, seen)
    seen[tid] = None


#: a prepared object whose sources are inline and at most this many bytes together is produced by one task
#: that reads them itself (a prepack or a raw publish), with no read task per source: a quantized CNN's
#: weights, scales, zero points and biases (cnn_int8_qoperator: 48 initializers, 61 session tasks before,
#: 13 after); reading one twice where two objects share it copies at most this much again. Such an
#: object starts no invocation step of its own either.
SELF_READ_BYTES = 64 << 10


def _self_reads(r: PreparedRequirement, manifest, inline: bool) -> tuple[str, ...]:
    """The sources of requirement ``r`` its producing task reads itself: all of them when they are small
    and inline (``inline``: every payload of the model is), else none; none either for a kernel that
    takes the sources' reads as they are (``source_form``: a cold run waits on those reads)."""
    if r.source_bytes > SELF_READ_BYTES or (r.spec is not None and r.spec.source_form):
        return ()
    if not inline:
        for s in r.sources:
            e = manifest[s]
            if type(e.descriptor.payload) is ExternalPayload or e.rows:
                return ()
    return r.sources


def _slot_name(key: PreparedKey) -> str:
    return key.lineage[0] if key.is_raw else key.slot_name


def _build_actions(resolved: ResolvedModel, graph: onnx.GraphProto) -> ExecutionPlan:
    """The compact action list over the resolution's bindings, with prepacked nodes rewired to read
    their prepared object (their binding is the prepack rule's kernel)."""
    recorded = resolved.initializer_names
    names = set(recorded) if recorded is not None else {t.name for t in graph.initializer}
    io = resolved.node_io if len(resolved.node_io) == resolved.node_count else None
    node_ins = [i for i, _ in io] if io is not None else None
    for idx, np_ in resolved.node_prepacks.items():
        slot = np_.key.slot_name
        if node_ins is not None:  # the plan reads these names, not the node's (left as written)
            node_ins[idx] = (slot, *(n for i, n in enumerate(node_ins[idx]) if i not in np_.spec.source_inputs))
        else:
            node = graph.node[idx]
            others = [n for i, n in enumerate(node.input) if i not in np_.spec.source_inputs]
            del node.input[:]
            node.input.extend([slot, *others])
        names.add(slot)  # a constant slot (the plan reads these names, not the graph's initializers)
    if node_ins is not None and resolved.node_prepacks:
        # an initializer only prepacks read gets no slot (nothing fills or reads it): what an action, a
        # body (implicit inputs) or the graph's inputs and outputs name keeps one
        read = {n for ins in node_ins for n in ins}
        for k in resolved.kernels:
            if k.implicit_inputs:
                read.update(k.implicit_inputs)
        read.update(i.name for i in graph.input)
        read.update(o.name for o in graph.output)
        names.intersection_update(read)
    if recorded is not None and graph.sparse_initializer:
        names.update(t.values.name for t in graph.sparse_initializer)
    meta = resolved.node_meta if len(resolved.node_meta) == resolved.node_count else None
    return build_execution_plan(graph, dict(resolved.opsets), resolved.functions, kernels=resolved.kernels,
                                node_io=(node_ins, [o for _, o in io]) if io is not None else None,
                                node_meta=meta, init_names=names)


def _invocation_steps(execution, graph, reqs, action_reqs, producer, io_bits, graph_meta=None) -> list[TaskDescriptor]:
    """Split the action list where a new external prepared object is first needed (``graph_meta``: the
    nodes' (name, domain, op_type) when the resolution recorded them)."""
    steps: list[tuple[int, int]] = []
    seen: set[int] = set()
    start = 0
    for pos, bits in enumerate(action_reqs):
        new = [b for b in bits if b not in seen]
        if new and pos > start and any(b in io_bits for b in new):
            steps.append((start, pos))
            start = pos
        seen.update(bits)
    if start < len(action_reqs) or not steps:
        steps.append((start, len(action_reqs)))
    tasks = []
    prev = None
    used_ids: set[str] = set()
    producer_of = [producer[r.key] for r in reqs]  # per requirement bit (a key's hash is a tuple's)
    for a, b in steps:
        if b > a:
            i = execution.actions[a].node_index
            if graph_meta is not None:
                name, _, op = graph_meta[i]
            else:
                node = graph.node[i]
                name, op = node.name, node.op_type
            base = f"I.{name or op}"
        else:
            base = "I.empty"
        tid = base
        n = 1
        while tid in used_ids:
            n += 1
            tid = f"{base}#{n}"
        used_ids.add(tid)
        bits = sorted({x for pos in range(a, b) for x in action_reqs[pos]})
        keys = tuple(reqs[x].key for x in bits)
        deps = ((prev,) if prev else ()) + tuple(dict.fromkeys(producer_of[x] for x in bits))
        tasks.append(TaskDescriptor(
            tid, TaskScope.INVOCATION, TaskKind.EXECUTE, "cpu", deps, keys, actions=(a, b),
            result=f"actions {a}..{b - 1} ({b - a} nodes)",
        ))
        prev = tid
    return tasks


def _validate(tasks: list[TaskDescriptor], by_id: dict[str, TaskDescriptor]) -> None:
    earlier: set[str] = set()
    ordered = True  # every dependency listed before its dependent (how the plan builds them): no cycle
    session, invocation = TaskScope.SESSION, TaskScope.INVOCATION
    for t in tasks:
        for d in t.dependencies:
            dep = by_id.get(d)
            if dep is None:
                raise PlanError(f"task {t.id} depends on unknown task {d}")
            if dep.scope is invocation and t.scope is session:
                raise PlanError(f"session task {t.id} depends on invocation task {d}")
            if d not in earlier:
                ordered = False
        earlier.add(t.id)
    if ordered:
        return
    state: dict[str, int] = {}
    stack: list[str] = []  # the path being visited (names the cycle)

    def visit(tid: str) -> None:
        s = state.get(tid, 0)
        if s == 2:
            return
        if s == 1:
            raise PlanError(f"dependency cycle: {' -> '.join([*stack, tid])}")
        state[tid] = 1
        deps = by_id[tid].dependencies
        if deps:
            stack.append(tid)
            for d in deps:
                visit(d)
            stack.pop()
        state[tid] = 2

    for t in tasks:
        visit(t.id)
