"""The replica without Ray: it starts before its weights, serves early requests correctly, shares the cache.

Correct means what a session without any cache computes (bit-exact: a packed object read from the
companion is the one prepacking made) and what onnxruntime computes (atol 1e-4, rtol 1e-3).
"""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from onnx_prepared.errors import InvalidFeedError, InvalidOptionError
from onnx_prepared.model import ExternalDataReader, load_model
from onnx_prepared.prepared.cache import verify
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.serve import codec
from onnx_prepared.serve.replica import ModelReplica, companion_path, session_options
from tests.helpers.serving import (
    GATE_LIMIT,
    PROMPT,
    direct_outputs,
    feeds,
    model_file,
    ort_outputs,
    prepack_counts,
    small_llm,
)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = small_llm(tmp_path_factory.mktemp("serve-llm"))
    model = model_file(folder)
    return folder, model, direct_outputs(model), ort_outputs(model)


def same(got, want, ort):
    assert sorted(got) == sorted(want)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n])
        np.testing.assert_allclose(got[n], ort[n], atol=1e-4, rtol=1e-3)


class GatedReader(ExternalDataReader):
    """Every weight read waits for ``gate``; ``started`` is set by the first read."""

    def __init__(self):
        super().__init__()
        self.gate, self.started = threading.Event(), threading.Event()

    def read(self, desc):
        self.started.set()
        if not self.gate.wait(GATE_LIMIT):
            raise AssertionError("gate never opened")
        return super().read(desc)


def test_replica_is_ready_before_its_weights_and_serves_an_early_request(llm, tmp_path):
    _, model, want, ort = llm
    reader = GatedReader()
    so = session_options({}, companion=companion_path(model, tmp_path / "cache"))
    replica = ModelReplica(model, session=RuntimeSession(model, so, reader=reader))
    try:
        assert reader.started.wait(GATE_LIMIT)  # preparation is under way, blocked in its reads ...
        assert not replica.preparing.done()      # ... and the constructor has returned

        async def early():
            task = asyncio.ensure_future(replica.infer(feeds()))
            await asyncio.sleep(0)  # let the request submit its run while no weight is resident
            assert not task.done()
            reader.gate.set()
            return await task

        same(asyncio.run(early()), want, ort)
        assert replica.wait_prepared(GATE_LIMIT)
        assert replica.status()["prepared"] and replica.status()["cache_entries"] > 0
    finally:
        reader.gate.set()
        replica.close()


def test_second_replica_reads_what_the_first_persisted(llm, tmp_path):
    _, model, want, ort = llm
    first = ModelReplica(model, tmp_path / "shared")
    try:
        same(asyncio.run(first.infer(feeds())), want, ort)
        assert first.wait_prepared(GATE_LIMIT)
        built, _ = prepack_counts(first.session)
        assert built > 0
    finally:
        first.close()
    second = ModelReplica(model, tmp_path / "shared")
    try:
        same(asyncio.run(second.infer(feeds())), want, ort)
        assert second.wait_prepared(GATE_LIMIT)
        assert prepack_counts(second.session) == (0, built)  # every packed object came from the cache
        assert second.session.companion.path == companion_path(model, tmp_path / "shared")
    finally:
        second.close()
    assert verify(companion_path(model, tmp_path / "shared")) == []


def test_a_cached_replica_maps_each_entry_once_and_reads_no_packed_source(llm, tmp_path, monkeypatch):
    """The hit's reads: one mapping per companion entry (payload + identity record), each hashed once;
    from the model's data file only the raw sources (norms, tables; a tied table feeds a raw Gather and the
    packed LM head), never a source only a packed object needs."""
    from onnx_prepared.prepared import cache_io, payload_hash

    _, model, want, ort = llm
    first = ModelReplica(model, tmp_path / "shared")
    first.wait_prepared(GATE_LIMIT)
    first.close()
    maps, hashes = [], []
    real_map, real_hasher = cache_io.map_payload, payload_hash.hasher
    monkeypatch.setattr(cache_io, "map_payload", lambda fd, off, n: maps.append((off, n)) or real_map(fd, off, n))
    monkeypatch.setattr(payload_hash, "hasher", lambda: hashes.append(1) or real_hasher())
    second = ModelReplica(model, tmp_path / "shared")
    try:
        same(asyncio.run(second.infer(feeds())), want, ort)
        assert second.wait_prepared(GATE_LIMIT)
        reqs = second.session.resolved.requirements
        cached = [r for r in reqs if not r.key.is_raw]
        assert cached and all(r.cached for r in cached)
        from onnx_prepared.prepared.cache_format import ID_SIZE

        assert sorted(maps) == sorted((r.active.entry.offset, r.active.entry.length + ID_SIZE) for r in cached)
        assert len(hashes) == len(cached)
        raw_sources = {s for r in reqs if r.key.is_raw for s in r.sources}  # a tied table is one of both
        manifest = second.session.resolved.manifest.active
        read = {n for n in second.session.state.reader.counts if manifest[n].descriptor is not None}
        assert all(second.session.state.reader.counts[r.active.name] == 1 for r in cached)
        assert read and read <= raw_sources
        assert not read & ({s for r in cached for s in r.sources} - raw_sources)
    finally:
        second.close()


def test_companion_path_is_keyed_by_the_model_not_the_machine(llm, tmp_path):
    _, model, _, _ = llm
    p = companion_path(model, "/shared/prepared", load_model(model).model)
    assert p.startswith("/shared/prepared/tiny-llm-") and p.endswith(".prepared.onnx")
    assert companion_path(model, "/x/given.onnx") == "/x/given.onnx"


def test_options_are_session_options_fields():
    so = session_options({"intra_op_num_threads": 1}, companion="/c/m.prepared.onnx")
    assert so.intra_op_num_threads == 1 and so.prepared_model_path == "/c/m.prepared.onnx"
    assert so.prepared_model_policy == "build_if_missing"
    with pytest.raises(InvalidOptionError, match="no_such_field"):
        session_options({"no_such_field": 1}, companion=None)
    with pytest.raises(InvalidOptionError, match="intra_op_num_threads"):
        session_options({"intra_op_num_threads": -3}, companion=None)


def test_codec_round_trips_and_names_bad_inputs():
    dtypes = {"ids": np.dtype(np.int64), "x": np.dtype(np.float32)}
    got = codec.decode_json(json.dumps({"inputs": {"ids": [[1, 2]], "x": {"data": [], "shape": [1, 0, 3]}}}), dtypes)
    assert got["ids"].dtype == np.int64 and got["ids"].shape == (1, 2)
    assert got["x"].dtype == np.float32 and got["x"].shape == (1, 0, 3)
    y = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    back = codec.outputs_from_json(codec.encode_json({"y": y}))
    np.testing.assert_array_equal(back["y"], y)
    assert back["y"].dtype == np.float32
    np.testing.assert_array_equal(codec.decode_npz(codec.encode_npz({"y": y}))["y"], y)
    for body, match in [("{", "not JSON"), ('{"x": 1}', "inputs"), ('{"inputs": {"zz": [1]}}', "unknown input 'zz'"),
                        ('{"inputs": {"x": [[1], [2, 3]]}}', "input 'x'"),
                        ('{"inputs": {"x": {"data": [1, 2], "shape": [3]}}}', "does not fit shape"),
                        ('{"inputs": {"x": {"data": [1], "dtype": "nope"}}}', "unknown dtype")]:
        with pytest.raises(InvalidFeedError, match=match):
            codec.decode_json(body, dtypes)
    with pytest.raises(InvalidFeedError, match="npz"):
        codec.decode_npz(b"not an archive")


def test_text_replica_streams_the_generators_tokens(llm, tmp_path):
    pytest.importorskip("tokenizers")
    import onnx_prepared.genai as og
    from onnx_prepared.serve.text import TextReplica

    folder, _, _, _ = llm
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 6)
    gen = og.Generator(model, params)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    want = [int(t) for t in gen.get_sequence()[len(PROMPT):]]
    model.close()

    replica = TextReplica(folder, tmp_path / "cache")
    try:
        async def pieces(request):
            return [p async for p in replica.generate(request)]

        got = asyncio.run(pieces({"tokens": PROMPT, "max_tokens": 6}))
        assert [p["token"] for p in got] == want
        prompt = " ".join(f"<{t}>" for t in PROMPT)
        by_text = asyncio.run(pieces({"prompt": prompt, "max_tokens": 6}))
        assert [p["token"] for p in by_text] == want
        assert "".join(p["text"] for p in by_text).split() == [f"<{t}>" for t in want]
        with pytest.raises(InvalidFeedError, match="'prompt'"):
            asyncio.run(pieces({"max_tokens": 3}))
        with pytest.raises(InvalidFeedError, match="max_tokens"):
            asyncio.run(pieces({"tokens": PROMPT, "max_tokens": 0}))
        with pytest.raises(InvalidFeedError, match="token ids"):
            asyncio.run(pieces({"tokens": [999]}))
    finally:
        replica.close()


def test_ray_loads_only_with_the_deployment():
    import subprocess
    import sys

    code = ("import sys, onnx_prepared, onnx_prepared.serve\n"
            "from onnx_prepared.serve import ModelReplica, TextReplica\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'starlette')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
