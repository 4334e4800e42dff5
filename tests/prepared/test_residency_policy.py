"""ResidencyPolicy decides and changes nothing; the store releases what it evicts; policies are enums."""

import pathlib
import re

import onnx_prepared
from onnx_prepared.memory import Arena
from onnx_prepared.options import EvictionPolicy, PreparedModelPolicy
from onnx_prepared.prepared import EntryState, PreparedObjectStore
from onnx_prepared.prepared.residency import ResidencyPolicy

KEYS = ["a", "b", "c", "d"]


def _store(arena):
    s = PreparedObjectStore(KEYS)
    for k in KEYS:
        g, _ = s.claim(k)
        s.publish(k, g, k.upper(), 10, arena.acquire(10, k))
    return s


def _policy(eviction=EvictionPolicy.AUTO, persisted=()):
    # requirement i is needed at action i of a 4-action run: from position 1, "a" is needed last (wraps)
    return ResidencyPolicy(25, {k: i for i, k in enumerate(KEYS)},
                           lambda bit, pos: (bit - pos) % 4, lambda k: k in persisted, eviction)


def test_victims_order_and_purity():
    arena = Arena("PreparedArena")
    s = _store(arena)
    before = (s.states(), s.epoch, arena.live, dict(s.counters))
    p = _policy(persisted={"c"})
    assert p.victims(s, 1, "b", critical=False) == ["c", "a", "d"]  # persisted first, then furthest next need
    assert p.victims(s, 1, "b", critical=True) == ["c", "a", "d"]
    s.try_pin("a")
    assert p.victims(s, 1, "b", critical=False) == ["c", "d"]  # pinned objects are never victims
    assert _policy(EvictionPolicy.REFUSE, persisted={"c"}).victims(s, 1, "b", critical=False) == ["c"]
    s.unpin("a")
    assert s.acquire_lease(s.epoch)
    assert p.victims(s, 1, "b", critical=True) == []  # a hot run leases everything
    s.release_lease()
    assert (s.states(), s.epoch, arena.live, dict(s.counters)) == before  # deciding changed nothing
    assert p.shortfall(arena.live, 0, 10, critical=True) == 40 + 10 - 25


def test_store_eviction_returns_the_bytes_to_the_arena():
    arena = Arena("PreparedArena")
    s = _store(arena)
    assert arena.live == 40
    alloc = s.evict("a")
    assert alloc is not None and alloc.released and arena.live == 30 and s.state("a") is EntryState.ABSENT


def test_policies_have_one_home_and_no_literal_comparisons():
    from onnx_prepared.prepared import cache

    assert cache.PreparedModelPolicy is PreparedModelPolicy
    values = "|".join(v.value for e in (PreparedModelPolicy, EvictionPolicy) for v in e)
    pattern = re.compile(rf"(==|!=)\s*[\"']({values})[\"']|[\"']({values})[\"']\s*(==|!=)")
    root = pathlib.Path(onnx_prepared.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
