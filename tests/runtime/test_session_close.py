"""``RuntimeSession.close()`` (docs/async.md): the runs submitted finish as they would have, then the
session's own preparation is cancelled and waited for, so nothing of a closed session runs afterwards,
on the shared default scheduler as on one the session owns."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from onnx_prepared.errors import ClosedError
from onnx_prepared.generate import generate_tiny_llm
from onnx_prepared.generate.config import TinyLlmConfig
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.scheduler.handle import HandleState

EMBED = "model.embed_tokens.weight"
# an untied float32 embedding: a row table, read whole at background priority after a cold run
CFG = dict(layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=4096, block_size=16,
           context_length=64, embedding="fp32")
OWN = {"io_workers": 2}  # a session with its own scheduler (io_workers != 4)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = generate_tiny_llm(tmp_path_factory.mktemp("close") / "m", **CFG)
    feeds = prefill_feeds(TinyLlmConfig.from_preset(None, **CFG), [900, 5, 17, 3000])
    with RuntimeSession(str(path), {"prepared_model_policy": "disabled"}) as s:
        want = s.run(feeds)
    return str(path), feeds, want


def test_a_closed_session_leaves_nothing_running_on_the_shared_scheduler(model):
    """A first run's end queues the row table's whole read at background priority; on the shared
    scheduler it outlived ``close()`` and read through the closed session's reader (and was the first
    read another session's run saw)."""
    path, feeds, _ = model
    with RuntimeSession(path, {"prepared_model_policy": "disabled"}) as s:
        assert not s.parts.owns_scheduler
        s.run(feeds)
    assert all(h.done() for h in list(s.producers._internal))
    producers = [s.store.producer(r.key) for r in s.plan.requirements if EMBED in r.key.lineage]
    assert producers and all(t is None or t.done for t in producers)


@pytest.mark.parametrize("extra", [{}, OWN], ids=["shared", "own"])
def test_close_waits_for_a_submitted_cold_run(model, extra):
    """Closed right after ``run_async``, the cold run still computes its outputs: its reads and prepacks
    are not cancelled under it (that raised InternalError, an illegal store transition, or ClosedError
    from a closed scheduler), and a run after close is refused."""
    path, feeds, want = model
    for _ in range(3):
        s = RuntimeSession(path, {"prepared_model_policy": "disabled", **extra})
        assert s.parts.owns_scheduler is bool(extra)
        h = s.run_async(feeds)
        s.close()
        assert h.done()
        for a, b in zip(h.result(), want, strict=True):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(ClosedError):
            s.run_async(feeds)


@pytest.mark.parametrize("extra", [{}, OWN], ids=["shared", "own"])
def test_close_cancels_prepare_async(model, extra):
    """``prepare_async()``'s handle is the session's preparation: close() cancels it on either scheduler
    (on the shared one it kept every task it holds wanted, so close() waited for the whole preparation),
    and nothing of it is live once close() returns. Gates: every prepack waits for ``gate``, so the
    preparation cannot end before close() asks; the gate opens once the handle is seen cancelling."""
    path, _, _ = model
    s = RuntimeSession(path, {"prepared_model_policy": "disabled", **extra})
    gate = threading.Event()
    prepack = s.state.prepack

    def gated(*args):
        assert gate.wait(20)
        prepack(*args)

    s.state.prepack = gated
    h = s.prepare_async()
    closer = threading.Thread(target=s.close)
    closer.start()
    try:
        deadline = time.monotonic() + 20
        while h.diagnostics.status not in (HandleState.CANCELLING, HandleState.CANCELLED):
            assert time.monotonic() < deadline, h.diagnostics.status  # a bound, not a timing assertion
            time.sleep(0.001)
    finally:
        gate.set()
        closer.join(20)
    assert not closer.is_alive() and h.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        h.result()
    assert not s.producers._internal or all(x.done() for x in list(s.producers._internal))
    assert all(t is None or t.done for t in (s.store.producer(r.key) for r in s.plan.requirements))
