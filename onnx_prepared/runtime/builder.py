"""Session construction: load -> companion cache -> resolve -> plan -> state, before any session exists.

:func:`build_session` runs the phases in order and returns :class:`SessionParts`; a
:class:`~onnx_prepared.runtime.session.RuntimeSession` only holds them and runs. Each phase is one
function here, so timing a phase or adding a read-ahead hint to one touches one place. No phase reads
a weight byte for the session: loading is metadata-only, and the first read happens when a session task
runs. From the companion's opening on (right after the load without one), a read-ahead
(runtime/read_ahead.py) streams the bytes the cold first run will read into the page cache, on threads
of its own, while resolution and planning run. The scheduler (when one is created) starts its threads on
a thread of its own meanwhile (runtime/background.py); the session waits for it after planning.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from onnx_prepared.kernels import threads
from onnx_prepared.memory import Arenas
from onnx_prepared.model import ExternalDataReader, LoadedModel, load_model, verified
from onnx_prepared.model.loader import inline_nested_external
from onnx_prepared.options import PreparedModelPolicy, SessionOptions, as_session_options
from onnx_prepared.plan.prepared_plan import PreparedExecutionPlan, build_prepared_plan
from onnx_prepared.records import record
from onnx_prepared.resolve import ManifestReader, ResolvedModel, resolve_model
from onnx_prepared.runtime.background import Background
from onnx_prepared.runtime.feeds import FeedBinder
from onnx_prepared.runtime.producers import Producers
from onnx_prepared.runtime.read_ahead import (
    ReadAhead,
    companion_ranges,
    companion_sources,
    index_ranges,
    load_ranges,
    plan_ranges,
    read_ahead_threads,
)
from onnx_prepared.runtime.state import PreparedExecutionState
from onnx_prepared.scheduler import CpuExecutor, MemoryBudget, RuntimeScheduler

_DEFAULT: RuntimeScheduler | None = None
_DEFAULT_LOCK = threading.Lock()


def default_scheduler() -> RuntimeScheduler:
    """The process-wide scheduler shared by sessions that bring none (like onnxruntime's global pools).

    Its CPU executor has one worker per core (:func:`~onnx_prepared.kernels.threads.machine_threads`), one
    of them reserved for inference: preparation may use the others. Created on first use; closed at
    interpreter exit.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            import atexit

            workers = threads.machine_threads()
            _DEFAULT = RuntimeScheduler(cpu=CpuExecutor(workers, critical_reserved=1 if workers > 1 else 0),
                                        io_workers=4, name="onnx-prepared")
            atexit.register(_DEFAULT.close, cancel=True)
        return _DEFAULT


@record(eq=False)
class SessionParts:
    """What construction produced, handed to the session as a whole (the session owns every part)."""

    options: SessionOptions
    loaded: LoadedModel
    #: the companion-model cache on disk (a PreparedModelStore), None when prepared_model_policy is disabled;
    #: not to be confused with ``state.store``, the in-memory store of prepared objects
    companion: Any
    resolved: ResolvedModel
    plan: PreparedExecutionPlan
    arenas: Arenas
    state: PreparedExecutionState
    scheduler: RuntimeScheduler
    owns_scheduler: bool  # True: the session created it and closes it
    producers: Producers
    feeds: FeedBinder
    #: the first run's bytes streaming into the page cache (runtime/read_ahead.py), or None
    read_ahead: ReadAhead | None = None


def build_session(
    model: str | os.PathLike | LoadedModel,
    options: Any = None,
    *,
    scheduler: RuntimeScheduler | None = None,
    reader: ExternalDataReader | None = None,
) -> SessionParts:
    """Load (metadata-only), open the companion cache, resolve, plan, and create the session state.

    ``options``: SessionOptions, a mapping of option names, or None (validated here: a bad value fails
    naming the option). ``scheduler``: share this one instead of choosing (see :func:`choose_scheduler`).
    ``reader``: the external-data reader session tasks read through (tests pass a gated one).
    """
    options = as_session_options(options)
    # The scheduler's threads start on a thread of its own while the source parses (runtime/background.py).
    sched_job = Background(choose_scheduler, options, scheduler) if _starts_threads(options, scheduler) else None
    ahead = None
    try:
        ahead, index = early_read_ahead(model, options)
        loaded = load(model)
        companion = open_companion(loaded, options, index)
        ahead = start_read_ahead(companion, options, loaded, ahead)
        reader = reader if reader is not None else make_reader(options)
        resolved = resolve_model(loaded, prepared=companion, policy=_policy(options))
        plan = build_prepared_plan(resolved, persist=companion is not None and companion.writable)
        ahead = extend_read_ahead(ahead, plan, resolved, options)
        if plan.persister:  # something to persist: every source read yields the (digest, fingerprint) it needs
            reader.hash_reads = True  # (a complete hit hashes no source; a corrupt entry's fallback turns it on)
        # NOTE: prepared_memory_limit is the residency budget (Producers' admission evicts and refuses
        # against it, and admits critical work above it: the run that needs it is what frees memory),
        # so it is not also a hard PreparedArena limit that a publish could fail on.
        arenas = Arenas.create(retention_caps=options.arena_retention_caps)
        state = PreparedExecutionState(plan, arenas, ManifestReader(resolved.manifest, reader), companion)
        sched, owns = sched_job.result() if sched_job is not None else choose_scheduler(options, scheduler)
        sched_job = None
        producers = Producers(plan, state, sched, options.prepared_memory_limit, options.eviction_policy)
        return SessionParts(options, loaded, companion, resolved, plan, arenas, state, sched, owns, producers,
                            FeedBinder(plan.execution, loaded.graph, plan.requirement_slots), ahead)
    except BaseException:
        if ahead is not None:  # its threads wait for the plan's ranges: end them
            ahead.stop()
        if sched_job is not None:  # a scheduler the session would have owned
            with contextlib.suppress(BaseException):
                sched, owns = sched_job.result()
                if owns:
                    sched.close(cancel=True)
        raise


def _starts_threads(options: SessionOptions, scheduler: RuntimeScheduler | None) -> bool:
    """Whether :func:`choose_scheduler` creates a scheduler (and so starts its threads)."""
    return scheduler is None and (_DEFAULT is None or not _shares_default(options))


def early_read_ahead(model: Any, options: SessionOptions) -> tuple[ReadAhead | None, Any]:
    """(read-ahead, (companion index, inode)) before the source's parse, when the options name a companion
    that the policy reads: its index, read now (the store opens it from this, :func:`open_companion`), and
    its payloads streaming (``read_ahead.index_ranges``); (None, None) otherwise, or when the index is
    unreadable (the store reports it). Whether the companion is this model's needs the parse:
    :func:`start_read_ahead` drops the stream if not (a companion whose recorded source data files are not
    the model's folder's does not start one).

    NOTE: the stream starts ~12 ms earlier (parse ~8 + companion open ~4 ms, medium preset). It starts
    ~5 ms into construction (importing the cache modules ~1 ms, reading the index ~2, the threads started
    without waiting for them, runtime/background.py); on a thread of its own it started 3-5 ms later
    (the parse holds the GIL) and the parse took 3-4 ms longer.
    """
    path = options.prepared_model_path
    if (not path or isinstance(model, LoadedModel) or options.prepared_memory_limit is not None
            or _policy(options) is PreparedModelPolicy.DISABLED):
        return None, None
    n = read_ahead_threads()
    if not n:
        return None, None
    from onnx_prepared.errors import CacheError
    from onnx_prepared.prepared.cache_io import read_index

    try:
        m, ino = read_index(os.path.abspath(os.fspath(path)))
    except CacheError:
        return None, None
    if m is None:
        return None, None
    ranges = index_ranges(m, os.fspath(model))
    return (ReadAhead(ranges, threads=n) if ranges else None), (m, ino)


def start_read_ahead(companion: Any, options: SessionOptions, loaded: LoadedModel | None = None,
                     ahead: ReadAhead | None = None) -> ReadAhead | None:
    """Start streaming what the cold first run reads into the page cache while resolution and planning
    run (runtime/read_ahead.py): a companion hit's payloads, or, without a usable companion entry, the
    source's external initializers less the tables a Gather reads (``read_ahead.load_ranges``; the plan
    says later whether one is read whole). None with nothing to read, when switched off, or under a
    residency budget (the cold path then reads a window, not everything). ``ahead``: the stream
    :func:`early_read_ahead` started, which these ranges extend, or which a stale companion's load ranges
    replace. On a hit, the source tensors no entry was packed from (norm weights, rotary tables: what its
    first run reads from the source) go ahead of every payload not yet started, the small ones only asked
    for at once (``ReadAhead.extend(front=True)``): queued behind the payloads, as the plan's batch would,
    the first run's first norm weight and rotary tables waited 6-11 ms for them (medium-genai, cold).

    NOTE: without a companion this starts ~11 ms earlier than the plan's batch would (resolve + plan).
    ttfo children, cold, main and this alternated 8 times each, this 2-vCPU Intel VM at load ~3-4 (other
    sessions): the last read before the output 9-17 ms earlier on all four rows, TTFO less interpreter
    and numpy -14.5 (medium) and -15.0 ms (medium-genai) at 16 tokens, +2 / +1 at 128 (compute-bound);
    process CPU not higher. A previous session's parse-time WILLNEED hint of the same bytes had cost
    17-23 ms of kernel CPU; these threads stream by ``sendfile`` as the plan's batch does.
    """
    if options.prepared_memory_limit is not None:
        return None
    n = read_ahead_threads()
    if not n:
        return None
    ranges = companion_ranges(companion) if companion is not None else []
    first: list[tuple[str, int, int]] = []  # a hit's source reads: ahead of the companion's payloads
    if ranges and loaded is not None:
        first = load_ranges(loaded, companion_sources(companion))
    if not ranges and ahead is not None:
        ahead.drop()  # the index read before the parse is not this model's (or has nothing to read)
    if not ranges and loaded is not None:
        ranges = load_ranges(loaded)
    if ahead is None:
        if not ranges:
            return None
        ahead = ReadAhead((), threads=n)
    ahead.extend(ranges, final=False)  # what the early batch had is not read again
    ahead.extend(first, final=False, front=True)
    return ahead


def extend_read_ahead(ahead: ReadAhead | None, plan: PreparedExecutionPlan, resolved: ResolvedModel,
                      options: SessionOptions) -> ReadAhead | None:
    """Queue the rest of what the plan's cold first run reads, in need order, behind what is queued
    (or start the read-ahead with it); the same conditions as :func:`start_read_ahead`."""
    n = read_ahead_threads()
    if options.prepared_memory_limit is not None or not n:
        return ahead
    ranges = plan_ranges(plan, resolved.manifest)
    if ahead is not None:
        ahead.extend(ranges, final=True)
        return ahead
    return ReadAhead(ranges, final=True, threads=n) if ranges else None


def load(model: str | os.PathLike | LoadedModel) -> LoadedModel:
    """The model, metadata-only (a LoadedModel is taken as is)."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    if loaded.nested_external:
        # NOTE: external tensors inside subgraphs/attributes are read now (onnx.reference-style
        # evaluators read those protos directly); top-level initializers stay metadata-only.
        with ExternalDataReader() as r:
            inline_nested_external(loaded, r)
    return loaded


def open_companion(loaded: LoadedModel, options: SessionOptions, index: Any = None) -> Any:
    """The companion-model cache the policy asks for (a PreparedModelStore), or None when disabled.
    ``index``: its (index, inode) as :func:`early_read_ahead` read it."""
    policy = _policy(options)
    if policy is PreparedModelPolicy.DISABLED:
        return None
    from onnx_prepared.prepared.cache import PreparedModelStore, default_prepared_path, source_model_digest

    digest = source_model_digest(loaded.path, loaded.model)
    path = options.prepared_model_path or default_prepared_path(loaded.path, digest=digest, model=loaded.model)
    companion = PreparedModelStore(path, source_digest=digest, policy=policy, index=index)
    companion.bind_sources(loaded.weights)  # digests trusted only under these fingerprints
    return companion


def make_reader(options: SessionOptions) -> ExternalDataReader:
    """The external-data reader of the session tasks.

    A tensor larger than memory_limit (or physical memory) is refused naming it, before numpy is asked
    for the buffer; prepared_memory_limit is a residency target one object may exceed. Recorded
    checksums are always verified: in the background (a run checks before it completes, model/verify.py),
    inline when the bytes are persisted (``hash_reads``, which :func:`build` sets for a writable companion
    after this, on a reader of its own or the caller's); what matched is
    recorded under the data file's fingerprint, so the next process need not hash it (model/verified.py).
    """
    return ExternalDataReader(max_tensor_bytes=options.memory_limit or None, defer_verify=True,
                              verified_dir=verified.default_dir())


def choose_scheduler(options: SessionOptions, scheduler: RuntimeScheduler | None) -> tuple[RuntimeScheduler, bool]:
    """(scheduler, owned). A session gets its own scheduler only when asked for non-default resources or
    a trace; otherwise it shares the process-wide one (thread start-up is not free, and N sessions must
    not mean N thread pools)."""
    if scheduler is not None:
        return scheduler, False
    if _shares_default(options):
        return default_scheduler(), False
    workers = threads.machine_threads()
    return RuntimeScheduler(
        cpu=CpuExecutor(workers, critical_reserved=1 if workers > 1 else 0),
        io_workers=options.io_workers,
        memory=MemoryBudget(options.memory_limit),
        trace=options.records_trace,
    ), True


def _shares_default(options: SessionOptions) -> bool:
    return options.io_workers == 4 and options.memory_limit is None and not options.records_trace


def _policy(options: SessionOptions) -> PreparedModelPolicy:
    p = options.prepared_model_policy  # a validated value ("disabled"): a dict read, not an enum call
    return _POLICIES.get(p) or PreparedModelPolicy(p)


_POLICIES = {p.value: p for p in PreparedModelPolicy}
