"""Row tables are verified against their model checksum even when they are never read whole (issue 14).

A row table (resolve/rows.py) is read by rows; under a residency budget its whole tensor is never
read, so the first row read asks the reader to stream-hash the whole tensor in pieces on the
verification thread (``ExternalDataReader.verify_whole``). The run that gathered the rows waits for it
and raises ``ExternalDataError`` on a mismatch, as every later run does (model/verify.py's semantics).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import onnx
import pytest

from onnx_prepared.errors import ExternalDataError
from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.model import ExternalDataReader, verified
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime.frame import ExecutionFrame
from tests.helpers.models import add_checksums

EMBED = "model.embed_tokens.weight"
SMALL = dict(layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=4096, block_size=16,
             context_length=64, embedding="fp32")  # a 1 MiB fp32 embedding: 4096 rows x 256 B
TABLE = 4096 * 256
PIECE = 256 << 10
BUDGET = {"prepared_memory_limit": 4 << 20}
FEEDS = prefill_feeds(TinyLlmConfig.from_preset(None, **SMALL), [1, 2, 3])


class CountingReader(ExternalDataReader):
    """Records every (tensor, offset, length, whole) read of the embedding; streamed pieces of it wait
    for ``gate`` (row reads do not)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.stream_piece = PIECE
        self.gate = threading.Event()
        self.gate.set()
        self.reads: list[tuple[int, int, bool]] = []

    def read_bytes(self, desc, out=None):
        if desc.name == EMBED and out is not None and desc.payload.length == PIECE:
            assert self.gate.wait(30), "the test never opened the gate"
        r = super().read_bytes(desc, out)
        if desc.name == EMBED:
            self.reads.append((desc.payload.offset, desc.payload.length, out is None))
        return r

    def pieces(self) -> list[int]:
        return [n for _, n, whole in self.reads if n == PIECE and not whole]


@pytest.fixture(autouse=True)
def _own_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))  # verification records land here
    monkeypatch.setattr(verified, "RACY_S", 0.0)  # the files here are seconds old: record them anyway


@pytest.fixture(scope="module")
def intact(tmp_path_factory) -> str:
    path = generate_tiny_llm(tmp_path_factory.mktemp("rowsum") / "m", **SMALL)
    add_checksums(path)
    return path


def _corrupt_copy(src: str, folder) -> str:
    """A copy of the model whose embedding's last row (no prompt here reads it) no longer matches."""
    m = onnx.load(src, load_external_data=True)
    path = str(folder / "m.onnx")
    onnx.save_model(m, path, save_as_external_data=True, location="m.data", size_threshold=1024)
    add_checksums(path)
    m = onnx.load(path, load_external_data=False)
    info = next({e.key: e.value for e in t.external_data} for t in m.graph.initializer if t.name == EMBED)
    assert int(info["length"]) == TABLE
    with open(os.path.join(folder, info["location"]), "r+b") as f:
        f.seek(int(info.get("offset", 0)) + TABLE - 256)
        f.write(np.full(64, 0.5, np.float32).tobytes())
    return path


def test_a_corrupt_row_table_under_a_budget_fails_every_run(intact, tmp_path):
    path = _corrupt_copy(intact, tmp_path)
    reader = CountingReader()
    with RuntimeSession(path, BUDGET, reader=reader) as s:
        assert EMBED in s.resolved.row_tables
        for _ in range(2):  # level-triggered: the second run's rows came from the same table
            with pytest.raises(ExternalDataError, match="checksum mismatch") as ei:
                s.run(FEEDS)
            assert ei.value.tensor == EMBED
    assert not [r for r in reader.reads if r[2]]  # never read whole into one buffer
    assert reader.pieces() == [PIECE] * (TABLE // PIECE)  # streamed once, one piece at a time


def test_an_intact_row_table_under_a_budget_is_streamed_once_and_the_run_waits_for_it(intact, monkeypatch):
    """Gates: the run's last node executes while the streamed hash is held back; it completes after."""
    computed = threading.Event()
    real_step = ExecutionFrame.step

    def step(frame, execution):
        real_step(frame, execution)
        if frame.pc == len(execution.actions):
            computed.set()

    monkeypatch.setattr(ExecutionFrame, "step", step)
    reader = CountingReader()
    reader.gate.clear()
    with RuntimeSession(intact, BUDGET, reader=reader) as s:
        h = s.run_async(FEEDS)
        assert computed.wait(30)  # every node ran on the rows read
        assert not h.done()  # ... but the result waits for the table's verification
        reader.gate.set()
        first = h.result(timeout=30)[0]
        second = s.run(FEEDS)[0]
    assert not [r for r in reader.reads if r[2]]
    assert reader.pieces() == [PIECE] * (TABLE // PIECE)  # once, not per run
    assert sorted(n for _, n, whole in reader.reads if n != PIECE) == [3 * 256, 3 * 256]  # rows 1-3, twice
    with RuntimeSession(intact) as s:
        s.prepare()  # the whole table, resident
        np.testing.assert_array_equal(s.run(FEEDS)[0], first)
    np.testing.assert_array_equal(first, second)


def test_a_verification_record_spares_a_later_process_the_stream(intact):
    for expect in (TABLE // PIECE, 0):
        reader = CountingReader(defer_verify=True, verified_dir=verified.default_dir())
        with RuntimeSession(intact, BUDGET, reader=reader) as s:
            s.run(FEEDS)
        assert len(reader.pieces()) == expect
