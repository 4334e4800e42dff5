"""The first (cold) run's critical path, proven with gates (events the test controls), never sleeps."""

import threading

import numpy as np

from onnx_prepared.prepared import EntryState
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.scheduler import CpuExecutor, RuntimeScheduler
from tests.helpers.models import gemm_mlp, reference_mlp

X = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)


def _key(s: RuntimeSession, source: str):
    (key,) = [r.key for r in s.plan.requirements if r.sources == (source,) and not r.key.is_raw]
    return key


def test_run_waiting_for_a_running_prepack_lends_its_slot_to_the_next_one(tmp_path):
    """W0's prepack holds preparation's only CPU slot (gated) when the run needs it: the slot the waiting
    run leaves prepacks W1, which it needs next. Without that W1 would queue behind W0."""
    path = gemm_mlp(tmp_path, layers=3)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=2)
    packing0, gate0, w1_done = threading.Event(), threading.Event(), threading.Event()
    try:
        with RuntimeSession(path, scheduler=sched) as s:
            w0, w1, w2 = (_key(s, f"W{i}") for i in range(3))
            prepack = s.state.prepack

            def gated(key, generation, entries):
                if key == w0:
                    packing0.set()
                    assert gate0.wait(20)
                prepack(key, generation, entries)

            s.state.prepack = gated
            hp = s.prepare_async()
            assert packing0.wait(20)  # W0's prepack is running on preparation's slot
            h = s.run_async({"x": X})
            sched.when_done(s.store.producer(w1), lambda _t: w1_done.set())
            assert w1_done.wait(20)  # W1 prepacked on the slot the waiting run left ...
            assert s.store.state(w1) is EntryState.RESIDENT
            assert h.is_ready() is False and s.store.state(w0) is not EntryState.RESIDENT
            assert s.store.state(w2) is not EntryState.RESIDENT  # ... and only W1: one ahead
            gate0.set()
            (y,) = h.result(timeout=20)
            hp.wait(timeout=20)
        np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    finally:
        gate0.set()
        sched.close(cancel=True)


def test_run_waiting_for_a_read_promotes_nothing_ahead(tmp_path, gated_reader):
    """Waiting for W0's read (held back), the run promotes no prepack ahead of it: a CPU slot taken
    meanwhile would delay the run once W0 arrives."""
    path = gemm_mlp(tmp_path, layers=2)
    gate0 = threading.Event()
    reader = gated_reader({"W0": gate0})
    with RuntimeSession(path, reader=reader) as s:
        bit0 = [r.key for r in s.plan.requirements].index(_key(s, "W0"))
        ahead, waited = [], threading.Event()
        promote_next, wait_for = s.inference._promote_next, s.inference._wait_for
        s.inference._promote_next = lambda frame, bit: (ahead.append(bit), promote_next(frame, bit))

        def spy_wait(*args):
            resume = wait_for(*args)
            waited.set()
            return resume

        s.inference._wait_for = spy_wait
        h = s.run_async({"x": X})
        assert waited.wait(20)  # the run yielded, waiting for W0's read
        gate0.set()
        (y,) = h.result(timeout=20)
        assert s.counters["yields"] >= 1
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert bit0 not in ahead


def test_cold_run_starts_its_chains_at_prefetch_in_need_order_and_the_row_table_after_it(tmp_path):
    """What a cold run submits and in which order, before its first node: one chain per requirement at
    prefetch priority, in the order the run first needs them (the I/O queue serves them FIFO), the run
    itself at critical; for an object the run computes in its source form (4-bit MatMulNBits), only its
    source reads, its prepack once the run has ended; a table read only by rows is not among them (its
    rows are read on the critical path) and is read whole at background priority once the run has ended."""
    from onnx_prepared.generate import generate_tiny_llm
    from onnx_prepared.generate.config import TinyLlmConfig
    from onnx_prepared.generate.feeds import prefill_feeds
    from onnx_prepared.scheduler import Priority

    small = dict(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=4096, block_size=16,
                 context_length=64, embedding="fp32")
    path = generate_tiny_llm(tmp_path / "m", **small)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=2)
    submitted: list[list] = []
    submit = sched.submit
    whole_submitted = threading.Event()

    def spy(tasks, **kw):  # (name, priority) as submitted (a waiting run promotes them later)
        tasks = [tasks] if hasattr(tasks, "fn") else list(tasks)
        submitted.append([(t.name, t.priority) for t in tasks])
        if any("embed_tokens" in t.name for t in tasks):
            whole_submitted.set()
        return submit(tasks, **kw)

    sched.submit = spy
    try:
        with RuntimeSession(path, scheduler=sched) as s:
            plan = s.plan
            embed = "model.embed_tokens.weight"
            assert embed in s.resolved.row_tables
            s.run(prefill_feeds(TinyLlmConfig.from_preset(None, **small), list(range(16))))
            chains, run = submitted[0], submitted[1]
            assert run == [("I.run-1", Priority.CRITICAL)]
            assert {p for _, p in chains} == {Priority.PREFETCH}
            forms = s.inference._transient
            assert forms  # the MatMulNBits weights
            want: list[str] = []
            for b in plan.need_order:
                r = plan.requirements[b]
                if r.sources == (embed,):
                    continue
                ids = [f"S.{n}.read_source" for n in r.sources] if b in forms else [plan.producer[r.key]]
                want += [i for i in ids if i not in want]
            assert [n for n, _ in chains if n in set(want)] == want  # need order
            assert not any(embed in n for n, _ in chains)  # rows first: no whole read before the output
            prepacks = {plan.producer[plan.requirements[b].key] for b in forms}
            assert not prepacks & {n for n, _ in chains}  # no prepack before the output ...
            assert whole_submitted.wait(20)  # once the run has ended ...
            assert prepacks <= {n for sub in submitted[2:] for n, _ in sub}  # (the prepacks just before)
            (later,) = [sub for sub in submitted[2:] if any(embed in n for n, _ in sub)]
            assert {p for _, p in later} == {Priority.BACKGROUND}  # ... behind everything else
    finally:
        sched.close(cancel=True)


def test_only_sources_of_4bit_prepacks_are_read_without_a_copy(tmp_path):
    """A 4-bit MatMulNBits prepack copies every byte of its sources into its panels, so those reads may be
    file mappings (ExternalDataReader.mark_transient); whatever is published as read (norm
    weights, rotary caches, an embedding read by rows) or shared with such a consumer (the tied
    embedding of the LM head) is copied."""
    from onnx_prepared.generate import generate_tiny_llm
    from onnx_prepared.generate.config import TinyLlmConfig
    from onnx_prepared.generate.feeds import prefill_feeds
    from onnx_prepared.model import ExternalDataReader

    class Recording(ExternalDataReader):
        def __init__(self):
            super().__init__()
            self.transient: dict[str, bool] = {}

        def read_bytes(self, desc, out=None):
            got = super().read_bytes(desc, out)
            if out is None:
                self.transient[desc.name] = (desc.payload.file, desc.payload.offset,
                                             desc.payload.length) in self._transient
            return got

    small = dict(layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512, block_size=16,
                 context_length=64)
    for embedding in ("fp32", None):
        cfg = dict(small, embedding=embedding) if embedding else small
        path = generate_tiny_llm(tmp_path / f"m-{embedding}", **cfg)
        reader = Recording()
        with RuntimeSession(path, reader=reader) as s:
            s.run(prefill_feeds(TinyLlmConfig.from_preset(None, **cfg), [1, 2, 3]))
            s.prepare()
            q4 = {n for r in s.plan.requirements if r.key.layout.startswith("matmul-nbits-q4-panel16")
                  for n in r.sources}
            raw = {r.sources[0] for r in s.plan.requirements if r.key.is_raw}
        read = reader.transient
        assert q4 - raw and {n for n in q4 - raw if n in read} == {n for n, t in read.items() if t}
        assert not any(read[n] for n in raw if n in read)
        if embedding is None:  # tied: the LM head's source is also the embedding GatherBlockQuantized reads
            assert q4 & raw and not any(read.get(n) for n in q4 & raw)


def test_session_tasks_rank_by_need_order(tmp_path):
    """Every session task of a requirement's chain (its reads and its prepack) carries the rank of that
    requirement in the run's need order, so a free preparation slot takes the prepack needed next (S2)
    even when a later layer's read finished first."""
    path = gemm_mlp(tmp_path, layers=3)
    sched = RuntimeScheduler(cpu=CpuExecutor(2, critical_reserved=1), io_workers=2)
    ranks: dict[str, int | None] = {}
    submit = sched.submit

    def spy(tasks, **kw):
        for t in [tasks] if hasattr(tasks, "fn") else list(tasks):
            ranks[t.name] = t.rank
            for d in t.dependencies:
                ranks[d.name] = d.rank
        return submit(tasks, **kw)

    sched.submit = spy
    try:
        with RuntimeSession(path, scheduler=sched) as s:
            (y,) = s.run({"x": X})
            plan = s.plan
            for i, b in enumerate(plan.need_order):
                key = plan.requirements[b].key
                chain = [d.id for d in plan.generation_tasks(key)]
                assert chain and all(ranks[t] == i for t in chain), (i, chain, ranks)
            assert ranks["I.run-1"] is None
    finally:
        sched.close(cancel=True)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
