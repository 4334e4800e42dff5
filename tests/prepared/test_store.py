import pytest

from onnx_prepared.errors import InternalError
from onnx_prepared.prepared import EntryState, PreparedObjectStore


def test_shared_generation_and_publish_wakes_waiters():
    s = PreparedObjectStore(["a", "b"])
    gen, produce = s.claim("a")
    gen2, produce2 = s.claim("a")  # second consumer joins the in-flight generation
    assert (gen, produce, gen2, produce2) == (1, True, 1, False)
    seen = []
    assert s.when_ready("a", lambda k, g, e: seen.append((k, g, e)))
    s.mark_preparing("a", gen)
    s.publish("a", gen, "A", 10)
    assert seen == [("a", 1, None)]
    assert s.counters["productions"] == 1 and s.counters["shared"] == 1
    assert not s.when_ready("a", lambda *a: None)  # already resident


def test_readiness_epoch_and_eviction():
    s = PreparedObjectStore(["a", "b"])
    for k in "ab":
        g, _ = s.claim(k)
        s.publish(k, g, k.upper(), 1)
    assert s.all_resident
    s.pin("a")
    assert s.evict("a") is None  # pinned objects are never evicted
    s.unpin("a")
    s.evict("a")
    assert not s.all_resident and s.states()["a"] is EntryState.ABSENT
    g, produce = s.claim("a")  # eviction removes residency, not identity: a new generation
    assert (g, produce) == (2, True)
    s.publish("a", g, "A2", 1)
    assert s.all_resident and s.get("a") == "A2"


def test_failure_then_retry_with_new_generation():
    s = PreparedObjectStore(["a"])
    g, _ = s.claim("a")
    errs = []
    s.when_ready("a", lambda k, gen, e: errs.append(e))
    s.fail("a", g, ValueError("bad read"))
    assert isinstance(errs[0], ValueError) and s.states()["a"] is EntryState.FAILED
    g2, produce = s.claim("a")
    assert (g2, produce) == (2, True)
    with pytest.raises(InternalError, match="stale"):
        s.publish("a", g, "old", 1)


def test_illegal_transition_is_internal_error():
    s = PreparedObjectStore(["a"])
    with pytest.raises(InternalError):
        s.pin("a")
    with pytest.raises(InternalError):
        s.mark_preparing("a", 0)
