"""Rows on demand (resolve/rows.py): a large constant Gather table is read by rows until resident."""

from __future__ import annotations

import functools
import itertools
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.cli import main
from onnx_prepared.errors import ExternalDataError
from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.kernels.gather_block_quantized import gather_block_quantized
from onnx_prepared.kernels.shape_ops import gather
from onnx_prepared.model import ExternalDataReader
from onnx_prepared.model.descriptors import ExternalPayload, WeightDescriptor
from onnx_prepared.resolve import resolve_model
from onnx_prepared.resolve.rows import MIN_TABLE_BYTES, RowView, hint_ranges, row_capable, row_reshape
from onnx_prepared.runtime import RuntimeSession

EMBED = "model.embed_tokens.weight"
# vocab x hidden x 4 B = 1 MiB: the smallest table read by rows
SMALL = dict(layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=4096, block_size=16,
             context_length=64, embedding="fp32")
STREAM = 64 << 10  # verify_whole's piece in these tests: more than any run of rows read here


class CountingReader(ExternalDataReader):
    """Records every (tensor, offset, length) read; a whole read of ``gated`` waits for ``gate``
    (``open_after_rows``: the gate opens once a row read of it completed). The pieces in which the
    whole table's checksum is verified (``verify_whole``, ``STREAM`` bytes each) go to ``streamed``."""

    def __init__(self, gated: str | tuple[str, ...], *, open_after_rows: bool = False) -> None:
        super().__init__()
        self.stream_piece = STREAM
        self.gated = {gated} if isinstance(gated, str) else set(gated)
        self.open_after_rows = open_after_rows
        self.gate = threading.Event()
        self.done: list[tuple[str, int, int]] = []
        self.streamed: list[tuple[str, int]] = []
        self.whole_started = 0
        self.events: list[tuple[str, object]] = []  # ("whole", tensor) in order, with the test's own events

    def read_bytes(self, desc, out=None):
        if desc.name in self.gated and out is None:  # a row read lands in a caller's buffer
            self.whole_started += 1
            self.events.append(("whole", desc.name))
            assert self.gate.wait(60)
        r = super().read_bytes(desc, out)
        if out is not None and desc.payload.length == STREAM:
            self.streamed.append((desc.name, desc.payload.length))
            return r
        self._record(desc.name, desc.payload.offset, desc.payload.length, rows=out is not None)
        return r

    def _gather_rows(self, desc, p, rows, row_bytes, out):
        """Scattered rows, gathered from one mapping: recorded as the runs of rows they are."""
        done = super()._gather_rows(desc, p, rows, row_bytes, out)
        if done:
            breaks = [0, *(np.flatnonzero(np.diff(rows) != 1) + 1).tolist(), len(rows)]
            for a, b in itertools.pairwise(breaks):
                self._record(desc.name, p.offset + int(rows[a]) * row_bytes, (b - a) * row_bytes, rows=True)
        return done

    def _record(self, name, offset, length, *, rows):
        self.done.append((name, offset, length))
        if self.open_after_rows and name in self.gated and rows:
            self.gate.set()


@pytest.fixture(scope="module")
def genai_model(tmp_path_factory) -> str:
    return generate_tiny_llm(tmp_path_factory.mktemp("rows") / "m", **SMALL)


def test_sixteen_token_prompt_reads_sixteen_rows_before_its_output(genai_model):
    reader = CountingReader(EMBED)
    tokens = [3 + 7 * k for k in range(15)] + [3]  # 15 distinct rows, one repeated, gaps between them
    feeds = prefill_feeds(TinyLlmConfig.from_preset(None, **SMALL), tokens)
    with RuntimeSession(genai_model, reader=reader) as sess:
        table = sess.resolved.row_tables[EMBED]
        desc = sess.resolved.manifest.active[EMBED].descriptor
        assert table.rows == 4096 and table.row_bytes == 256 and desc.nbytes >= MIN_TABLE_BYTES
        first = sess.run(feeds)[0]
        rows = sorted((off - desc.payload.offset) // table.row_bytes for n, off, ln in reader.done if n == EMBED)
        lengths = {ln for n, _, ln in reader.done if n == EMBED}
        assert rows == sorted(set(tokens)) and lengths == {table.row_bytes}  # one read per row, none whole
        reader.gate.set()
        sess.prepare()  # the whole table, read once, behind the run
        assert [ln for n, _, ln in reader.done if n == EMBED].count(desc.nbytes) == 1
        again = sess.run(feeds)[0]
        assert sess.counters["hot_runs"] == 1
    np.testing.assert_array_equal(first, again)  # rows gathered = gathered from the whole table


def test_under_a_residency_budget_the_table_is_never_read_whole(genai_model):
    reader = CountingReader(EMBED)
    feeds = prefill_feeds(TinyLlmConfig.from_preset(None, **SMALL), [1, 2, 3])
    with RuntimeSession(genai_model, {"prepared_memory_limit": 4 << 20}, reader=reader) as sess:
        first = sess.run(feeds)[0]
        second = sess.run(feeds)[0]
        assert reader.whole_started == 0
        assert sorted(ln for n, _, ln in reader.done if n == EMBED) == [3 * 256, 3 * 256]  # rows 1-3, twice
        # the model records checksums: the whole table was hashed once, streamed, never held whole
        assert sum(ln for n, ln in reader.streamed if n == EMBED) == 4096 * 256
    np.testing.assert_array_equal(first, second)


def test_rows_are_read_in_contiguous_runs(genai_model):
    reader = CountingReader(EMBED)
    feeds = prefill_feeds(TinyLlmConfig.from_preset(None, **SMALL), [10, 11, 12, 40, 41, 9])
    with RuntimeSession(genai_model, reader=reader) as sess:
        sess.run(feeds)
        reads = [ln // 256 for n, _, ln in reader.done if n == EMBED]
        reader.gate.set()
    assert sorted(reads) == [2, 4]  # rows 9-12 and 40-41


def test_tied_embedding_reads_rows_through_the_reshape_and_whole_for_the_lm_head(tmp_path):
    """genai's tied form: GatherBlockQuantized(Reshape(LM head INT4 weight)); the head needs it all."""
    cfg = dict(SMALL, vocab=32768, embedding="tied")  # INT4 [32768, 64/2]: 1 MiB
    path = generate_tiny_llm(tmp_path / "tied", **cfg)
    weight = "lm_head.MatMul.weight_Q4G16"  # block_size 16
    reader = CountingReader(weight, open_after_rows=True)  # the whole read waits for the first row read
    feeds = prefill_feeds(TinyLlmConfig.from_preset(None, **cfg), [5, 6, 7, 30000])
    with RuntimeSession(path, reader=reader) as sess:
        table = sess.resolved.row_tables[weight]
        assert table.row_nodes == ("/model/embed_tokens/GatherBlockQuantized",) and table.row_bytes == 32
        assert len(table.whole_for) == 1 and table.whole_for[0].startswith(weight + "+")
        first = sess.run(feeds)[0]
        rows = [ln // 32 for n, _, ln in reader.done if n == weight and ln < table.rows * 32]
        assert sorted(rows) == [1, 3]  # rows 5-7 and 30000, then the whole tensor for the LM head
        sess.prepare()
        again = sess.run(feeds)[0]
    np.testing.assert_array_equal(first, again)


def test_inspect_plan_names_row_granular_reads(genai_model, capsys):
    with pytest.raises(SystemExit) as e:
        sys.exit(main(["inspect", genai_model, "--plan"]))
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert f"{EMBED}: row-granular reads (4096 rows x 256 B) for node(s) '/model/embed_tokens/Gather'" in out


def _table_file(tmp_path, arrays: dict[str, np.ndarray]) -> dict[str, WeightDescriptor]:
    path = tmp_path / "t.bin"
    descs, off = {}, 0
    with open(path, "wb") as f:
        for name, a in arrays.items():
            f.write(a.tobytes())
            elem = helper.np_dtype_to_tensor_dtype(a.dtype)
            descs[name] = WeightDescriptor(name, elem, a.shape, ExternalPayload(str(path), off, a.nbytes))
            off += a.nbytes
    return descs


def test_row_capable_gather_matches_the_kernel(tmp_path):
    x = np.random.default_rng(0).standard_normal((50, 3, 2)).astype(np.float32)
    view = RowView(_table_file(tmp_path, {"x": x})["x"], ExternalDataReader())
    call = row_capable(gather, (0,))
    for idx in (np.array([[4, -1, 4], [0, 49, 7]]), np.array(5), np.array([], np.int64)):
        np.testing.assert_array_equal(call(view, idx)[0], gather(x, idx)[0])
    np.testing.assert_array_equal(call(x, np.array([1, 2]))[0], x[[1, 2]])  # a resident table passes through
    with pytest.raises(IndexError, match="index 50 is out of bounds for axis 0 with size 50"):
        call(view, np.array([1, 50]))


def test_row_capable_gather_block_quantized_matches_the_kernel(tmp_path):
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (40, 32), dtype=np.uint8)  # K = 64, 4 bits
    scales = rng.random((40, 4), dtype=np.float32)
    zp = rng.integers(0, 256, (40, 2), dtype=np.uint8)
    d = _table_file(tmp_path, {"d": data, "s": scales, "z": zp})
    r = ExternalDataReader()
    views = [RowView(d[k], r) for k in "dsz"]
    call = row_capable(functools.partial(gather_block_quantized, bits=4, block_size=16), (0, 2, 3), strict=False)
    idx = np.array([[3, 39, -2, 3], [0, 41, 5, 6]])  # 41: out of range, zeroed by the kernel
    want = gather_block_quantized(data, idx, scales, zp, bits=4, block_size=16)[0]
    got = call(views[0], idx, views[1], views[2])[0]
    np.testing.assert_array_equal(got, want)
    got = call(views[0], idx, scales, views[2])[0]  # scales already resident
    np.testing.assert_array_equal(got, want)


def test_scattered_rows_of_every_table_are_hinted_before_the_first_row_read(tmp_path):
    """A cold node's scattered row reads are requested together (will_need), so they wait about one
    device latency in all instead of one each behind the streaming reads; runs closer than HINT_GAP are
    one hint; the scattered rows are then gathered from one mapping per table, contiguous ones read."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (40, 32), dtype=np.uint8)
    scales = rng.random((40, 4), dtype=np.float32)
    d = _table_file(tmp_path, {"d": data, "s": scales})
    events: list[tuple[str, str, list]] = []

    class Recording(ExternalDataReader):
        def will_need(self, desc, ranges):
            events.append(("hint", desc.name, list(ranges)))
            super().will_need(desc, ranges)

        def _gather_rows(self, desc, p, rows, row_bytes, out):
            events.append(("gather", desc.name, rows.tolist()))
            return super()._gather_rows(desc, p, rows, row_bytes, out)

        def read_bytes(self, desc, out=None):
            events.append(("read", desc.name, [(desc.payload.offset, desc.payload.length)]))
            return super().read_bytes(desc, out)

    r = Recording()
    call = row_capable(functools.partial(gather_block_quantized, bits=4, block_size=16), (0, 2), strict=False)
    idx = np.array([7, 3, 4, 30])  # rows 3-4 contiguous: three runs per table
    got = call(RowView(d["d"], r), idx, RowView(d["s"], r))[0]
    np.testing.assert_array_equal(got, gather_block_quantized(data, idx, scales, bits=4, block_size=16)[0])
    s_off = d["s"].payload.offset
    assert events == [("hint", "d", [(3 * 32, 28 * 32)]), ("hint", "s", [(s_off + 3 * 16, 28 * 16)]),
                      ("gather", "d", [3, 4, 7, 30]), ("gather", "s", [3, 4, 7, 30])]
    events.clear()
    call(RowView(d["d"], r), np.array([5, 6]), RowView(d["s"], r))  # one run each: one read, nothing to hint
    assert [(k, rs) for k, _, rs in events] == [("read", [(5 * 32, 64)]), ("read", [(s_off + 5 * 16, 32)])]


def test_hint_ranges_merge_close_runs_and_cut_long_ones():
    assert hint_ranges([(0, 10), (100, 10), (1000, 10)], gap=100, piece=1 << 20) == [(0, 110), (1000, 10)]
    assert hint_ranges([(0, 10), (50, 10)], gap=100, piece=40) == [(0, 10), (50, 10)]  # merged would exceed piece
    assert hint_ranges([(0, 100)], gap=0, piece=40) == [(0, 40), (40, 40), (80, 20)]


@pytest.mark.parametrize("mapped", ["1", "0"])
def test_scattered_rows_read_mapped_or_run_by_run_are_the_same(tmp_path, monkeypatch, mapped):
    monkeypatch.setenv("ONNX_PREPARED_SOURCE_MMAP", mapped)
    x = np.random.default_rng(1).standard_normal((3000, 5)).astype(np.float32)  # rows span several pages
    view = RowView(_table_file(tmp_path, {"x": x})["x"], ExternalDataReader())
    rows = np.array([0, 1, 2, 700, 2998, 2999])
    np.testing.assert_array_equal(view.take(rows), x[rows])
    assert view.reads == 3 and view.rows_read == 6 and view.reader.bytes_read == 6 * 20


def test_scattered_rows_of_a_file_that_shrank_raise(tmp_path):
    x = np.arange(4096 * 4, dtype=np.float32).reshape(4096, 4)
    desc = _table_file(tmp_path, {"x": x})["x"]
    view = RowView(desc, ExternalDataReader())
    with open(desc.payload.file, "r+b") as f:
        f.truncate(1000 * 16)
    with pytest.raises(ExternalDataError, match="shrank"):
        view.take(np.array([1, 3000]))


def test_table_shared_with_a_packed_consumer_is_read_whole_for_it(tmp_path):
    """A float table that is both an embedding (Gather) and a Gemm's B: rows for the Gather, the whole
    tensor for the Gemm's prepacked weight, and the plan says which consumer needs what."""
    w = np.random.default_rng(2).standard_normal((2048, 128)).astype(np.float32)  # 1 MiB
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2048])
    g = helper.make_graph([helper.make_node("Gather", ["W", "ids"], ["e"], name="embed"),
                           helper.make_node("Gemm", ["e", "W"], ["y"], name="head", transB=1)],
                          "tied", [ids], [y], [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "tied.onnx")
    onnx.save_model(m, path, save_as_external_data=True, location="tied.data", size_threshold=0)
    feeds = {"ids": np.array([5, 0, 2047, 5])}
    with RuntimeSession(path) as sess:
        table = sess.resolved.row_tables["W"]
        assert table.row_nodes == ("embed",) and len(table.whole_for) == 1 and "Gemm" not in table.whole_for[0]
        assert "whole tensor for" in sess.resolved.manifest.active["W"].rows
        out = sess.run(feeds)[0]
    np.testing.assert_allclose(out, w[feeds["ids"]] @ w.T, rtol=1e-4, atol=1e-4)


def test_small_and_inline_tables_are_read_whole(tmp_path):
    w = np.ones((16, 4), np.float32)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    g = helper.make_graph([helper.make_node("Gather", ["W", "ids"], ["y"])], "g", [ids], [y],
                          [numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    resolved = resolve_model_from(m, tmp_path)
    assert dict(resolved.row_tables) == {} and resolved.manifest.active["W"].rows == ""


def resolve_model_from(m: onnx.ModelProto, tmp_path) -> object:
    from onnx_prepared.model import load_model

    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return resolve_model(load_model(str(path)))


def test_row_reshape_keeps_rows_or_reads_the_whole_table(tmp_path):
    x = np.arange(40 * 8, dtype=np.uint8).reshape(40, 2, 4)
    view = RowView(_table_file(tmp_path, {"x": x})["x"], ExternalDataReader())
    call = row_reshape(lambda a, s: (a.reshape(s),))
    (kept,) = call(view, np.array([40, 8]))
    assert type(kept) is RowView and kept.shape == (40, 8)
    np.testing.assert_array_equal(kept.take(np.array([0, 39])), x.reshape(40, 8)[[0, 39]])
    (kept0,) = call(view, np.array([0, -1]))  # 0 copies the input dim: still rows
    assert type(kept0) is RowView and kept0.shape == (40, 8)
    (whole,) = call(view, np.array([80, 4]))  # axis 0 changes: read whole, reshape as written
    np.testing.assert_array_equal(whole, x.reshape(80, 4))
    assert view.rows_read == 2 + 40


def test_on_a_cache_hit_the_tied_table_is_read_by_rows_and_whole_only_after_the_output(tmp_path, monkeypatch,
                                                                                        capsys):
    """On a complete companion hit the LM head's packed form comes from the companion: a 16-token prompt
    reads only its 16 rows of the tied INT4 table (data and scales) before its output, none whole."""
    import onnx_prepared.resolve.rows as rows_mod

    monkeypatch.setattr(rows_mod, "MIN_TABLE_BYTES", 64 << 10)  # the scales (256 KiB) are a row table too
    cfg = dict(SMALL, vocab=32768, embedding="tied")  # INT4 [32768, 64/2]: 1 MiB
    path = generate_tiny_llm(tmp_path / "tied", **cfg)
    weight = "lm_head.MatMul.weight_Q4G16"
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "tied.prepared.onnx")}
    tokens = [3 + 1000 * k for k in range(16)]  # 16 distinct rows, none adjacent
    feeds = prefill_feeds(TinyLlmConfig.from_preset(None, **cfg), tokens)
    with RuntimeSession(path, opts) as sess:  # the miss: builds the companion
        expected = sess.run(feeds)[0]
        assert sess.resolved.row_tables[weight].whole_for  # read whole for the LM head's prepack
        sess.prepare()
        sess.flush_cache()
    scales = "lm_head.MatMul.weight_scale"
    reader = CountingReader((weight, scales))  # a whole read of either waits for the gate, opened after the run
    with RuntimeSession(path, opts, reader=reader) as sess:
        tables = sess.resolved.row_tables
        assert set(tables) == {weight, scales}
        for t in tables.values():
            assert t.whole_for == () and len(t.cached_for) == 1  # nothing needs it whole before the output
            assert "whole tensor at background priority (cached packed form for" in t.describe()
            assert "row-granular reads" in sess.resolved.manifest.active[t.source].rows
        last = len(sess.inference.plan.execution.actions) - 1
        with sess.trace_actions(lambda i: i == last and reader.events.append(("output", list(reader.done)))):
            first = sess.run(feeds)[0]
        (at_output,) = [v for e, v in reader.events if e == "output"]
        assert reader.events[0][0] == "output"  # no whole read of either table started before the output
        for name, t in tables.items():
            desc = sess.resolved.manifest.active[name].descriptor
            reads = [(off, ln) for n, off, ln in at_output if n == name]
            assert sorted((off - desc.payload.offset) // t.row_bytes for off, ln in reads) == tokens
            assert {ln for _, ln in reads} == {t.row_bytes}  # 16 row reads, one each, no whole read
        reader.gate.set()
        sess.prepare()  # then read whole, at background priority, for the hot path
        again = sess.run(feeds)[0]
        assert sess.counters["hot_runs"] == 1
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(first, again)
    capsys.readouterr()
    assert main(["inspect", path, "--plan", "--cache", opts["prepared_model_path"]]) == 0
    out = capsys.readouterr().out
    assert f"{weight}: row-granular reads (32768 rows x 32 B)" in out
    assert "whole tensor at background priority (cached packed form for lm_head.MatMul.weight_Q4G16+" in out


def test_prepare_submits_row_tables_last_and_gathered_only_ones_at_background_priority(tmp_path, monkeypatch):
    """prepare_async beside a replica's first run: the run gathers rows, so the tables come after every
    other requirement, as on the cold path; on a hit nothing needs the tied table whole (background)."""
    import onnx_prepared.resolve.rows as rows_mod
    from onnx_prepared.scheduler import Priority

    monkeypatch.setattr(rows_mod, "MIN_TABLE_BYTES", 64 << 10)  # the scales (256 KiB) are a row table too
    cfg = dict(SMALL, vocab=32768, embedding="tied")
    path = generate_tiny_llm(tmp_path / "tied", **cfg)
    opts = {"prepared_model_policy": "build_if_missing", "prepared_model_path": str(tmp_path / "tied.prepared.onnx")}
    for hit in (False, True):
        with RuntimeSession(path, opts) as sess:
            plan, tables = sess.plan, sess.resolved.row_tables
            rows = {b for b, r in enumerate(plan.requirements) if r.key.is_raw and r.sources[0] in tables}
            order = sess.inference.prepare_order()
            assert sorted(b for b, _ in order) == sorted(plan.need_order)  # each requirement once
            assert [b for b, _ in order[:-len(rows)]] == [b for b in plan.need_order if b not in rows]
            assert {b for b, _ in order[-len(rows):]} == rows and len(rows) == 2
            assert all(p is Priority.PREFETCH for _, p in order[:-len(rows)])
            # the miss reads the tied weight whole for the LM head's prepack; the hit only gathers from it
            want = Priority.BACKGROUND if hit else Priority.PREFETCH
            assert {p for b, p in order if b in rows and not tables[plan.requirements[b].sources[0]].whole_for} \
                <= {Priority.BACKGROUND}
            weight_bit = next(b for b in rows if plan.requirements[b].sources[0].endswith("_Q4G16"))
            assert dict(order)[weight_bit] is want
            sess.prepare()
            sess.flush_cache()


def test_a_cold_run_gathering_rows_does_not_import_numpy_ma(tmp_path):
    """np.unique without return_inverse (numpy 2.4) asks np.ma.is_masked, importing numpy.ma: 12-16 ms of
    a cold first run's critical path. A fresh process's first run, gathering scattered rows of a row
    table, must not load it."""
    import ast
    import subprocess

    path = generate_tiny_llm(tmp_path / "m", **SMALL)
    np.savez(tmp_path / "feeds.npz", **prefill_feeds(TinyLlmConfig.from_preset(None, **SMALL), [3, 900, 7, 4000]))
    code = ("import sys, numpy as np\nfrom onnx_prepared import RuntimeSession\n"
            f"feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))\n"
            f"s = RuntimeSession({str(path)!r}, {{'prepared_model_policy': 'disabled'}})\n"
            f"assert {EMBED!r} in s.resolved.row_tables\n"
            "s.run(feeds)\nprint(sorted(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "numpy.ma" not in set(ast.literal_eval(out.strip().splitlines()[-1]))
