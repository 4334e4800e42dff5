"""Cold-start read-ahead (runtime/read_ahead.py): which byte ranges a session streams into the page cache,
in which order, and that the threads read exactly those and end (stopped, finished or failed)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.model.descriptors import ExternalPayload
from onnx_prepared.resolve import rows as rows_mod
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime import read_ahead as ra

EMBED = "model.embed_tokens.weight"
# vocab x hidden x 4 B = 1 MiB: the untied float32 embedding is a row table (read by rows, not ahead)
SMALL = dict(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=4096, block_size=16,
             context_length=64)


@pytest.fixture(scope="module", params=[None, "fp32"], ids=["tied", "fp32-embedding"])
def model(request, tmp_path_factory):
    cfg = dict(SMALL, embedding=request.param) if request.param else SMALL
    path = generate_tiny_llm(tmp_path_factory.mktemp("ra") / "m", **cfg)
    return str(path), prefill_feeds(TinyLlmConfig.from_preset(None, **cfg), list(range(16))), request.param


def _external(sess, name):
    d = sess.resolved.manifest.active[name].descriptor
    return d.payload if d is not None and isinstance(d.payload, ExternalPayload) else None


def test_plan_ranges_follow_need_order_and_leave_row_only_tables_out(model, monkeypatch):
    path, _, embedding = model
    monkeypatch.setattr(rows_mod, "MIN_TABLE_BYTES", 64 << 10)  # the tied INT4 table (128 KiB) too
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        tables = s.resolved.row_tables
        ranges = ra.plan_ranges(s.plan, s.resolved.manifest)
        assert len(ranges) == len(set(ranges))
        want, late = [], []
        for b in s.plan.need_order:
            for n in s.plan.requirements[b].sources:
                p = _external(s, n)
                if p is not None:
                    (late if n in tables else want).append((p.file, p.offset, p.length))
        want = list(dict.fromkeys(want))
        if embedding == "fp32":  # read by rows only: never streamed ahead
            assert list(tables) == [EMBED] and not tables[EMBED].whole_for
            assert ranges == want
        else:  # tied: the LM head needs the whole tables (weight, scales), streamed after everything else
            assert len(tables) == 2 and all(t.whole_for for t in tables.values())
            assert ranges == want + list(dict.fromkeys(r for r in late if r not in want))
        # every external payload the plan reads is streamed, but a row-only table
        externals = {(p.file, p.offset, p.length) for n in s.resolved.manifest.active
                     if (p := _external(s, n)) is not None and (n not in tables or tables[n].whole_for)}
        assert set(ranges) == externals


def test_a_session_streams_its_plan_ranges_and_the_threads_end(model):
    path, feeds, _ = model
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        ahead = s.parts.read_ahead
        assert ahead is not None
        ahead.join(30)
        assert ahead.done
        early = ra.load_ranges(s.parts.loaded)  # from the load, then the plan's ranges not queued yet
        rest = [r for r in ra.plan_ranges(s.plan, s.resolved.manifest) if r not in set(early)]
        assert ahead.bytes_read + ahead.bytes_skipped == (sum(n for _, _, n in ra.spans(early))
                                                          + sum(n for _, _, n in ra.spans(rest)))
        with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as other:
            assert all(np.array_equal(a, b) for a, b in zip(s.run(feeds), other.run(feeds), strict=True))


def test_no_read_ahead_under_a_residency_budget_or_when_switched_off(model, monkeypatch):
    path, _, _ = model
    with RuntimeSession(path, {"prepared_model_policy": "disabled", "prepared_memory_limit": 1 << 30}) as s:
        assert s.parts.read_ahead is None
    monkeypatch.setenv(ra.READ_AHEAD_ENV, "0")
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        assert s.parts.read_ahead is None
    monkeypatch.setenv(ra.READ_AHEAD_ENV, "3")
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        assert s.parts.read_ahead.threads == 3


@pytest.mark.parametrize("named", [True, False], ids=["named", "default-path"])
def test_a_companion_hit_streams_its_payloads_and_asks_for_its_source_reads_at_once(model, tmp_path, monkeypatch,
                                                                                     named):
    """A hit streams its payloads; the source tensors no entry was packed from (norm weights, rotary
    tables: what its first run reads from the source) are asked for at once when the companion opens,
    before the plan, and not streamed; the plan's batch adds only what is left."""
    path, feeds, _ = model
    cache = str(tmp_path / "m.prepared.onnx")
    with RuntimeSession(path, {"prepared_model_policy": "build_if_missing", "prepared_model_path": cache}) as s:
        s.prepare()
    advised: list[list[tuple[str, int, int]]] = []
    orig_advise = ra.advise

    def recording_advise(ranges, *args, **kwargs):
        ranges = list(ranges)
        advised.append(ranges)
        return orig_advise(ranges, *args, **kwargs)

    monkeypatch.setattr(ra, "advise", recording_advise)
    opts = {"prepared_model_policy": "read_only", "prepared_model_path": cache if named else None}
    if not named:
        monkeypatch.setattr("onnx_prepared.prepared.cache.default_prepared_path", lambda *a, **k: cache)
    with RuntimeSession(path, opts) as s:
        payloads = ra.companion_ranges(s.companion)
        assert payloads and payloads == sorted(payloads)
        assert {f for f, _, _ in payloads} <= {e.file for e in s.companion.entries().values()}
        cached = [r for r in s.plan.requirements if r.cached]
        assert {(r.active.entry.file, r.active.entry.offset, r.active.entry.length) for r in cached} == set(payloads)
        first = ra.load_ranges(s.parts.loaded, ra.companion_sources(s.companion))
        assert first and all(0 < n <= ra.SMALL for _, _, n in first)  # this model's: norm weights and rotary
        assert not set(first) & set(payloads) and s.parts.loaded.path not in {f for f, _, _ in payloads}
        from_source = [r for batch in advised for r in batch if r not in set(payloads)]
        assert from_source[:len(first)] == first  # when the companion opened, before the plan's batch
        ahead = s.parts.read_ahead
        ahead.join(30)
        assert ahead.done
        rest = [r for r in ra.plan_ranges(s.plan, s.resolved.manifest) if r not in set(payloads) | set(first)]
        want = sum(n for _, _, n in ra.spans(payloads)) + sum(n for _, _, n in ra.spans(rest))
        assert ahead.bytes_read + ahead.bytes_skipped == want
        s.run(feeds)


def _file(tmp_path, size):
    p = tmp_path / "data.bin"
    p.write_bytes(np.arange(size, dtype=np.uint8).tobytes())
    return str(p)


def test_spans_merge_adjacent_ranges_of_one_file_in_order():
    assert ra.spans([("a", 0, 10), ("a", 10, 5), ("a", 15 + ra.MERGE_GAP, 1), ("b", 16, 4), ("a", 0, 3),
                     ("a", 50, 0)]) == [("a", 0, 16 + ra.MERGE_GAP), ("b", 16, 4), ("a", 0, 3)]
    assert list(ra.pieces([("a", 5, 10)], 4)) == [("a", 5, 4), ("a", 9, 4), ("a", 13, 2)]


def test_read_ahead_reads_each_range_once_waits_for_the_final_batch_and_stops(tmp_path):
    path = _file(tmp_path, 1 << 20)
    ahead = ra.ReadAhead([(path, 0, 1000), (path, 1000, 24)], piece=256, threads=2)
    ahead.extend([(path, 0, 1000)], final=False)  # queued before: not read again
    assert not ahead.done  # waiting for the final batch
    ahead.extend([(path, 4096, 4096)], final=True)
    ahead.join(30)
    assert ahead.done and ahead.bytes_read + ahead.bytes_skipped == 1024 + 4096
    ahead = ra.ReadAhead([], threads=2)  # waiting for ranges: stop() ends the threads, no batch read after it
    ahead.stop()
    ahead.join(30)
    ahead.extend([(path, 0, 4096)])
    assert ahead.done and ahead.bytes_read == 0


@pytest.mark.skipif(ra._NOWAIT is None, reason="no RWF_NOWAIT")
def test_pieces_already_in_the_page_cache_are_skipped_until_one_misses(tmp_path, monkeypatch):
    path = _file(tmp_path, 1 << 20)  # just written: in the page cache
    ahead = ra.ReadAhead([(path, 0, 1 << 20)], final=True, piece=64 << 10)
    ahead.join(30)
    assert ahead.bytes_skipped == 1 << 20 and ahead.bytes_read == 0
    probes = []
    real = os.preadv

    def cold(fd, buffers, offset, flags=0):  # every page missing: the first probe fails, then reads only
        if flags:
            probes.append(offset)
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real(fd, buffers, offset)

    monkeypatch.setattr(ra.os, "preadv", cold)
    ahead = ra.ReadAhead([(path, 0, 1 << 20)], final=True, piece=64 << 10, threads=1)
    ahead.join(30)
    assert ahead.bytes_read == 1 << 20 and ahead.bytes_skipped == 0
    assert probes == [(64 << 10) - 1]


@pytest.mark.parametrize("how", ["sendfile", "preadv"])
def test_pieces_are_read_whole_by_either_call(tmp_path, monkeypatch, how):
    path = _file(tmp_path, 300_001)
    if how == "preadv":  # no /dev/null for sendfile: copy into the thread's buffer
        monkeypatch.setattr(ra, "_dev_null", lambda: None)
    monkeypatch.setattr(ra, "_NOWAIT", None)  # no probe: read every piece
    ahead = ra.ReadAhead([(path, 1, 300_000)], final=True, piece=64 << 10, threads=2)
    ahead.join(30)
    assert ahead.done and ahead.bytes_read == 300_000 and ahead.bytes_skipped == 0
    assert (ahead._null is None) == (how == "preadv")


def test_a_missing_file_ends_the_read_ahead_quietly(tmp_path):
    path = _file(tmp_path, 4096)
    os.unlink(path)
    ahead = ra.ReadAhead([(path, 0, 4096)], final=True)
    ahead.join(30)
    assert ahead.done and ahead.bytes_read == 0


def test_threads_from_the_environment(monkeypatch):
    monkeypatch.delenv(ra.READ_AHEAD_ENV, raising=False)
    assert ra.read_ahead_threads() == ra.THREADS
    for value, want in (("0", 0), ("1", 1), ("x", ra.THREADS)):
        monkeypatch.setenv(ra.READ_AHEAD_ENV, value)
        assert ra.read_ahead_threads() == want


def test_a_batchs_small_ranges_are_asked_for_at_once(tmp_path, monkeypatch):
    """posix_fadvise(WILLNEED) on each small range of a batch as it is queued (at most ADVISE_MAX per
    batch); large ranges are only streamed, and a file that cannot be opened is skipped quietly."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise")
    path = _file(tmp_path, 1 << 20)
    asked = []
    monkeypatch.setattr(ra.os, "posix_fadvise", lambda fd, off, n, advice: asked.append((off, n, advice)))
    small, big = (path, 8192, 4096), (path, 65536, ra.SMALL + 1)
    assert ra.advise([big, small, (str(tmp_path / "gone"), 0, 4096), (path, 0, ra.SMALL)]) == 2
    assert asked == [(8192, 4096, os.POSIX_FADV_WILLNEED), (0, ra.SMALL, os.POSIX_FADV_WILLNEED)]
    asked.clear()
    assert ra.advise([(path, 4096 * i, 4096) for i in range(10)], limit=3) == 3 and len(asked) == 3
    asked.clear()
    other = str(tmp_path / "other.bin")  # the file a hit's source norms are in: nothing large streamed from it
    with open(other, "wb") as f:
        f.write(bytes(1 << 16))
    ahead = ra.ReadAhead([big], threads=1)
    ahead.extend([(other, 8192, 4096), big], final=True)  # big was queued before: neither read nor asked for again
    ahead.join(30)
    assert ahead.done and ahead.advised == 1 and asked == [(8192, 4096, os.POSIX_FADV_WILLNEED)]
    assert ahead.bytes_read + ahead.bytes_skipped == 4096 + ra.SMALL + 1


def test_small_ranges_of_a_streamed_file_are_not_advised(tmp_path, monkeypatch):
    """A cold start without a companion streams the source's data file in need order: its small ranges
    (norm weights) come in their turn, and advising them up front scattered the device's queue ahead of
    the stream. A file with a range larger than SMALL queued (in this batch or before) is not advised."""
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise")
    path, other = _file(tmp_path, 1 << 20), str(tmp_path / "other.bin")
    with open(other, "wb") as f:
        f.write(bytes(1 << 16))
    asked = []
    monkeypatch.setattr(ra.os, "posix_fadvise", lambda fd, off, n, advice: asked.append((off, n)))
    ahead = ra.ReadAhead([(path, 0, 4096), (path, 65536, ra.SMALL + 1), (other, 0, 4096)], threads=1)
    ahead.extend([(path, 8192, 4096), (other, 8192, 4096)], final=True)  # path streamed before this batch
    ahead.join(30)
    assert ahead.done and ahead.advised == 2 and asked == [(0, 4096), (8192, 4096)]  # other's two ranges


def test_without_a_companion_the_source_streams_from_the_load_less_the_gathered_tables(model):
    """Known right after the parse: every external initializer in file order but those a Gather reads
    (a row table: the plan's batch says whether it is read whole, and then after everything else)."""
    path, feeds, embedding = model
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        early = ra.load_ranges(s.parts.loaded)
        assert early == sorted(early)
        loaded = s.parts.loaded.weights
        # the tied INT4 table and its scales reach their GatherBlockQuantized through Reshapes
        gathered = {EMBED} if embedding else {"lm_head.MatMul.weight_Q4G16", "lm_head.MatMul.weight_scale"}
        want = sorted((p.file, p.offset, p.length) for n, d in loaded.items()
                      if isinstance(p := d.payload, ExternalPayload) and n not in gathered)
        assert early == want
        ahead = s.parts.read_ahead
        ahead.join(30)
        assert ahead.done
        rest = [r for r in ra.plan_ranges(s.plan, s.resolved.manifest) if r not in set(early)]
        assert ahead.bytes_read + ahead.bytes_skipped == (sum(n for _, _, n in ra.spans(early))
                                                          + sum(n for _, _, n in ra.spans(rest)))
        s.run(feeds)


def test_a_named_companion_streams_from_its_index_before_the_parse_and_nothing_twice(model, tmp_path,
                                                                                   monkeypatch):
    """With prepared_model_path given, the companion's payloads stream from its index before the source
    is parsed (the parse waits here for the first piece), in file order, then the plan's ranges not
    queued yet; no byte is queued twice. A companion of another model (its data file's fingerprint
    matching) is dropped at the parse: the source's ranges stream instead, and the run is right."""
    import threading

    import onnx

    from onnx_prepared.prepared.cache_io import read_index
    from onnx_prepared.runtime import builder

    path, feeds, _ = model
    cache = str(tmp_path / "m.prepared.onnx")
    with RuntimeSession(path, {"prepared_model_policy": "build_if_missing", "prepared_model_path": cache}) as s:
        s.prepare()
        want_out = s.run(feeds)
    jobs: list[tuple[str, int, int]] = []
    first, at_parse = threading.Event(), []
    orig_next, orig_load = ra.ReadAhead._next, builder.load

    def counting_next(self):
        job = orig_next(self)
        if job is not None:
            jobs.append(job)
            first.set()
        return job

    def gated_load(m):
        assert first.wait(30)  # the stream is under way before the parse
        at_parse.append(len(jobs))
        return orig_load(m)

    monkeypatch.setattr(ra.ReadAhead, "_next", counting_next)
    monkeypatch.setattr(builder, "load", gated_load)
    payloads = ra.index_ranges(read_index(cache)[0], path)
    assert payloads and payloads == sorted(payloads)
    # its recorded source data file is not in another folder: no stream before the parse there
    assert ra.index_ranges(read_index(cache)[0], str(tmp_path / "elsewhere.onnx")) == []
    with RuntimeSession(path, {"prepared_model_policy": "read_only", "prepared_model_path": cache}) as s:
        assert ra.companion_ranges(s.companion) == payloads
        s.parts.read_ahead.join(30)
        assert s.parts.read_ahead.done
        early = list(ra.pieces(ra.spans(payloads)))
        assert at_parse[0] >= 1 and jobs[:at_parse[0]] == early[:at_parse[0]]
        asked = ra.load_ranges(s.parts.loaded, ra.companion_sources(s.companion))  # asked for, not streamed
        rest = [r for r in ra.plan_ranges(s.plan, s.resolved.manifest) if r not in set(payloads) | set(asked)]
        assert jobs == early + list(ra.pieces(ra.spans(rest)))
        assert all(np.array_equal(a, b) for a, b in zip(s.run(feeds), want_out, strict=True))
    byte_ranges = sorted(jobs)  # no byte queued twice
    assert not [(a, b) for a, b in itertools.pairwise(byte_ranges) if a[0] == b[0] and a[1] + a[2] > b[1]]

    other = onnx.load(path, load_external_data=False)  # another source model (its digest), the same weights
    other.doc_string = "another model"
    other_path = os.path.join(os.path.dirname(path), "other.onnx")
    onnx.save(other, other_path)
    jobs.clear()
    first.clear()
    with RuntimeSession(other_path, {"prepared_model_policy": "read_only", "prepared_model_path": cache}) as s:
        assert s.companion.stale_reason is not None and not any(r.cached for r in s.plan.requirements)
        s.parts.read_ahead.join(30)
        source = [j for j in jobs if j[0] not in {f for f, _, _ in payloads}]
        assert source[:1] == list(ra.pieces(ra.spans(ra.load_ranges(s.parts.loaded))))[:1]
        assert len(set(jobs)) == len(jobs)
        assert all(np.array_equal(a, b) for a, b in zip(s.run(feeds), want_out, strict=True))
