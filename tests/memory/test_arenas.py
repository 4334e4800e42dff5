import threading

import pytest

from onnx_prepared.memory import Arena, ArenaLimitError, Arenas


def test_live_and_retained_accounting():
    a = Arena("PreparationArena", limit=100, retention_cap=30)
    x = a.acquire(60, "src")
    y = a.acquire(40, "scratch")
    assert (a.live, a.retained, a.peak_live) == (100, 0, 100)
    with pytest.raises(ArenaLimitError, match="PreparationArena"):
        a.acquire(1)
    x.release()
    x.release()  # idempotent
    assert (a.live, a.retained) == (40, 30)  # 60 freed, retention capped at 30
    z = a.acquire(20)
    assert (a.live, a.retained) == (60, 10)  # reuse of retained capacity first
    y.release()
    z.release()
    assert a.live == 0 and a.retained == 30
    assert a.trim() == 30 and a.reserved == 0


def test_transfer_moves_bytes_between_domains():
    arenas = Arenas.create(prepared_limit=10)
    buf = arenas.preparation.acquire(50, "read W0")
    pub = buf.transfer(arenas.prepared)  # admitted hand-off may exceed the limit by force
    assert arenas.preparation.live == 0 and arenas.prepared.live == 50
    pub.release()
    assert arenas.snapshot()["prepared"] == {"live": 0, "retained": 50, "peak_live": 50}


def test_concurrent_acquire_release_balances():
    a = Arena("ExecutionArena")

    def work():
        for _ in range(2000):
            a.acquire(7).release()

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert a.live == 0 and a.allocations == 8000
