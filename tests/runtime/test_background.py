"""Construction's background job (runtime/background.py, runtime/builder.py): the scheduler's threads
start on a thread of their own while the source parses; a failed construction ends what was started."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from onnx_prepared.runtime import RuntimeSession, builder
from onnx_prepared.runtime.background import Background
from tests.helpers.models import gemm_mlp

X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


def test_background_returns_the_value_or_reraises_the_error_on_every_call():
    gate = threading.Event()
    where: list[int] = []

    def job(a, b):
        where.append(threading.get_ident())
        assert gate.wait(30)
        return a + b

    j = Background(job, 2, 3)  # returns before the job runs: it waits for the gate
    assert not j.done
    gate.set()
    assert j.result() == 5 and j.result() == 5 and j.done
    assert where and where[0] != threading.get_ident()

    def fails():
        raise KeyError("k")

    bad = Background(fails)
    for _ in range(2):
        with pytest.raises(KeyError, match="k"):
            bad.result()


def test_the_scheduler_starts_while_the_source_parses(tmp_path, monkeypatch):
    """The scheduler's creation waits here until the parse has started: done on the constructing thread
    before the parse, as before, it would never see the gate open (the wait would fail)."""
    path = gemm_mlp(tmp_path, layers=2)
    with RuntimeSession(path) as s:
        (want,) = s.run({"x": X})
    parsing = threading.Event()
    seen: list[bool] = []
    orig_load, orig_choose = builder.load, builder.choose_scheduler

    def load(m):
        parsing.set()
        return orig_load(m)

    def choose(*args):
        seen.append(parsing.wait(30) and threading.current_thread() is not threading.main_thread())
        return orig_choose(*args)

    monkeypatch.setattr(builder, "load", load)
    monkeypatch.setattr(builder, "choose_scheduler", choose)
    with RuntimeSession(path, {"trace": True}) as s:
        assert seen == [True] and s.parts.owns_scheduler
        np.testing.assert_array_equal(s.run({"x": X})[0], want)


def test_a_failed_construction_closes_the_scheduler_it_started_and_stops_the_stream(tmp_path, monkeypatch):
    path = gemm_mlp(tmp_path, layers=2)
    cache = str(tmp_path / "m.prepared.onnx")
    with RuntimeSession(path, {"prepared_model_policy": "build_if_missing", "prepared_model_path": cache}) as s:
        s.prepare()
    made: dict[str, object] = {}
    orig_choose, orig_early = builder.choose_scheduler, builder.early_read_ahead

    def choose(*args):
        made["sched"] = orig_choose(*args)[0]
        return made["sched"], True

    def early(*args):
        out = made["early"] = orig_early(*args)
        return out

    def broken_resolve(*args, **kwargs):
        raise RuntimeError("resolve failed")

    monkeypatch.setattr(builder, "choose_scheduler", choose)
    monkeypatch.setattr(builder, "early_read_ahead", early)
    monkeypatch.setattr(builder, "resolve_model", broken_resolve)
    with pytest.raises(RuntimeError, match="resolve failed"):
        RuntimeSession(path, {"prepared_model_policy": "read_only", "prepared_model_path": cache, "trace": True})
    assert made["sched"]._closed
    ahead = made["early"][0]
    assert ahead is not None
    ahead.join(30)
    assert ahead.done
