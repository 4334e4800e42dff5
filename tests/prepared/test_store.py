import pytest

from onnx_prepared.errors import InternalError
from onnx_prepared.prepared import EntryState, PreparedObjectStore


def test_shared_generation_and_publish():
    """Consumers of one key share its in-flight generation; its completion is its producer task's (the
    store keeps no second completion mechanism)."""
    s = PreparedObjectStore(["a", "b"])
    gen, produce = s.claim("a")
    gen2, produce2 = s.claim("a")  # second consumer joins the in-flight generation
    assert (gen, produce, gen2, produce2) == (1, True, 1, False)
    s.mark_preparing("a", gen)
    assert s.states()["a"] is EntryState.PREPARING and s.try_pin("a") is None
    s.publish("a", gen, "A", 10)
    assert s.states()["a"] is EntryState.RESIDENT and s.entry("a").generation == 1 and s.get("a") == "A"
    assert s.counters["productions"] == 1 and s.counters["shared"] == 1
    assert s.claim("a") == (1, False)  # already resident: nothing to produce
    assert not hasattr(s, "when_ready") and not hasattr(s.entry("a"), "waiters")


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
    s.fail("a", g, ValueError("bad read"))
    assert isinstance(s.entry("a").error, ValueError) and s.states()["a"] is EntryState.FAILED
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


def test_try_pin_returns_none_for_the_normal_race():
    """A consumer racing eviction or production gets None, never an exception (pin() stays strict)."""
    s = PreparedObjectStore(["a"])
    assert s.try_pin("a") is None  # absent
    g, _ = s.claim("a")
    assert s.try_pin("a") is None  # loading
    s.publish("a", g, "A", 1)
    assert s.try_pin("a", 3) == "A" and s.entry("a").pins == 1 and s.entry("a").last_use == 3
    assert s.evict("a") is None  # pinned
    s.unpin("a")
    s.evict("a")
    assert s.try_pin("a") is None and s.entry("a").pins == 0


def test_generation_record_holds_producer_reservation_and_shared_reads():
    """One record per key, written only by the store: producing task, in-flight bytes, shared reads."""
    s = PreparedObjectStore(["a@raw", "a@packed"])
    g, _ = s.claim("a@packed")
    task = object()
    s.set_producer("a@packed", g, task)
    assert s.producer("a@packed") is task and s.producer("a@raw") is None
    assert s.reserve("a@packed", 40) and not s.reserve("a@packed", 40)
    assert s.reserved_bytes() == 40 and s.reservations() == {"a@packed": 40}
    r1, new1 = s.attach_read("a")
    r2, new2 = s.attach_read("a")  # the raw object and the prepack share one read of source "a"
    assert r1 is r2 and (new1, new2) == (True, False) and r1.users == 2
    s.fill_read(r1, "bytes", None)
    s.detach_reads([r1])
    assert r1.value == "bytes"  # still used by the other production
    s.detach_reads([r2])
    assert r1.value is None and s.attach_read("a")[1]  # freed; the next production reads again
    s.publish("a@packed", g, "P", 40)
    s.settle("a@packed")
    assert s.producer("a@packed") is None and s.reserved_bytes() == 0
    with pytest.raises(InternalError, match="stale"):
        s.set_producer("a@packed", g - 1, task)


def test_the_record_holds_where_this_session_persisted_the_object():
    s = PreparedObjectStore(["a"])
    assert s.persisted("a") is None
    entry = object()
    s.set_persisted("a", entry)
    g, _ = s.claim("a")
    s.publish("a", g, "A", 1)
    s.evict("a")
    assert s.persisted("a") is entry  # eviction removes residency, not where a restore reads
