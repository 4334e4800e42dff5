"""onnx_prepared.records.record behaves as dataclasses.dataclass for every form the package uses."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import field

import pytest

from onnx_prepared import records
from onnx_prepared.records import record


def _pair(ours: bool = False, **kw):
    """The same class body made by dataclass and by record (declared with records.field if ``ours``)."""

    def body(field=field):
        class Point:
            """A point."""

            x: int
            y: float = 1.5
            tags: list = field(default_factory=list)
            note: str = field(default="n", compare=False, repr=False)

            def norm(self) -> float:
                return self.x + self.y

        return Point

    return dataclasses.dataclass(body(), **kw), record(body(records.field if ours else field), **kw)


def _hash(x):
    try:
        return hash(x)
    except TypeError:
        return "unhashable"


FORMS = [dict(), dict(frozen=True), dict(frozen=True, slots=True), dict(eq=False), dict(slots=True),
         dict(frozen=True, eq=False)]


@pytest.mark.parametrize("ours", [False, True], ids=["dataclasses.field", "records.field"])
@pytest.mark.parametrize("kw", FORMS, ids=str)
def test_same_behaviour_as_dataclass(kw, ours):
    D, R = _pair(ours, **kw)
    for args in ((1,), (2, 3.0), (4, 5.0, [1]), (6, 7.0, [], "m")):
        d, r = D(*args), R(*args)
        assert repr(d) == repr(r)
        assert (d.x, d.y, d.tags, d.note) == (r.x, r.y, r.tags, r.note)
        assert r.norm() == d.norm()
        assert (r == R(*args)) == (d == D(*args))
        assert (r == R(*args[:1], 99.0)) == (d == D(*args[:1], 99.0))
        assert (type(R).__hash__ is None) == (type(D).__hash__ is None)
        assert (R.__hash__ is None) == (D.__hash__ is None)
        assert _hash(r) == _hash(d) or (_hash(r) != "unhashable" and not kw.get("eq", True))  # eq=False: id
        if kw.get("frozen") and kw.get("eq", True):  # note is neither compared nor hashed
            assert R(args[0], 1.0, None, "a") == R(args[0], 1.0, None, "b")
            assert hash(R(args[0], 1.0, None, "a")) == hash(R(args[0], 1.0, None, "b")) == \
                hash(D(args[0], 1.0, None, "c"))
        assert [f.name for f in dataclasses.fields(r)] == [f.name for f in dataclasses.fields(d)]
        assert dataclasses.is_dataclass(r) and dataclasses.asdict(r) == dataclasses.asdict(d)
        assert dataclasses.replace(r, x=10).x == 10 and dataclasses.replace(r, x=10).y == r.y
        assert repr(records.replace(r, x=10)) == repr(dataclasses.replace(r, x=10))
        assert R.__match_args__ == D.__match_args__
    assert R.__doc__ == "A point." and R.__qualname__.endswith("Point")
    assert R(1).tags is not R(1).tags  # a fresh factory value per instance
    assert hasattr(R, "__slots__") == hasattr(D, "__slots__")
    r = R(1, 2.0, [3])
    if kw.get("frozen"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.x = 2
        with pytest.raises(dataclasses.FrozenInstanceError):
            del r.x
    else:
        r.x = 2
        assert r.x == 2
    for clone in (copy.copy(r), copy.deepcopy(r)):
        assert (clone.x, clone.y, clone.tags) == (r.x, r.y, r.tags)


@record(frozen=True, slots=True)
class _Frozen:
    a: int
    b: tuple = ()


@record(frozen=True, slots=True, cache_hash=True)
class _CachedKey:
    lineage: tuple
    layout: str


@record
class _Plain:
    a: int
    b: list = field(default_factory=list)


def test_pickle_round_trip():
    for r in (_Frozen(1, (2,)), _Plain(3, [4])):
        back = pickle.loads(pickle.dumps(r))
        assert back == r and back is not r


def test_required_after_default_is_refused():
    class Bad:
        a: int = 1
        b: int

    with pytest.raises(TypeError):
        record(Bad)


def test_post_init_runs():
    @record(frozen=True, slots=True)
    class P:
        a: int
        b: int = 0

        def __post_init__(self):
            if self.a < 0:
                raise ValueError("a")
            object.__setattr__(self, "b", self.a * 2)

    assert P(3).b == 6
    with pytest.raises(ValueError):
        P(-1)


def test_init_false_fields():
    @record(frozen=True, slots=True)
    class A:
        a: int
        b: int = field(init=False, default=5)
        c: tuple = field(init=False, repr=False, compare=False)

        def __post_init__(self):
            object.__setattr__(self, "c", (self.a,))

    a = A(1)
    assert (a.a, a.b, a.c) == (1, 5, (1,)) and repr(a).endswith("A(a=1, b=5)")
    assert a == A(1) and hash(a) == hash(A(1))
    assert dataclasses.replace(a, a=2).c == (2,)
    with pytest.raises(TypeError):
        A(1, 2)


def test_unsupported_forms_are_dataclasses():
    """kw_only, order, inheritance: handed to dataclass unchanged."""

    @record(order=True)
    class B:
        a: int

    @record
    class Base:
        a: int

    @record
    class C(Base):
        c: int = 0

    assert B(1) < B(2) and C(1, 2).c == 2 and dataclasses.fields(C)[0].name == "a"


def test_records_field_in_a_form_handed_to_dataclass():
    """A records.field in a class record hands to dataclass becomes a dataclasses.field."""

    @record(order=True)
    class B:
        a: int
        b: list = records.field(default_factory=list, compare=False)

    assert B(1) < B(2) and B(1).b == [] and B(1).b is not B(1).b and B(1, [1]) == B(1, [2])
    assert [f.name for f in dataclasses.fields(B)] == ["a", "b"]
    with pytest.raises(ValueError):
        records.field(default=1, default_factory=list)


def test_cache_hash_keeps_the_dataclass_hash_and_recomputes_it_on_unpickling():
    """``cache_hash`` computes the hash once (after ``__post_init__``), equal to the dataclass one; the
    hidden slot is no field, and pickle/copy compute it again (str hashes differ between processes)."""

    def body():
        class Key:
            lineage: tuple
            layout: str
            note: str = field(default="", compare=False)

        return Key

    D = dataclasses.dataclass(frozen=True)(body())
    R = record(frozen=True, slots=True, cache_hash=True)(body())
    k = R(("a", "b"), "raw", "x")
    assert hash(k) == hash(D(("a", "b"), "raw")) == hash(R(("a", "b"), "raw", "y")) and k == R(("a", "b"), "raw")
    assert [f.name for f in dataclasses.fields(k)] == ["lineage", "layout", "note"]
    assert repr(k).rsplit(".", 1)[-1] == repr(D(("a", "b"), "raw", "x")).rsplit(".", 1)[-1]
    state = k.__getstate__()
    assert state == [("a", "b"), "raw", "x"]
    back = R.__new__(R)
    back.__setstate__(state)
    assert back == k and hash(back) == hash(k)
    for clone in (copy.copy(k), copy.deepcopy(k), records.replace(k, note="z")):
        assert clone == k and hash(clone) == hash(k)
    key = _CachedKey(("a",), "raw")
    assert pickle.loads(pickle.dumps(key)) == key and hash(pickle.loads(pickle.dumps(key))) == hash(key)
    with pytest.raises(dataclasses.FrozenInstanceError):
        k._record_hash = 1
    with pytest.raises(TypeError):
        record(frozen=True, cache_hash=True)(body())  # no slots
    with pytest.raises(TypeError):
        record(slots=True, cache_hash=True)(body())  # not frozen


def test_replace_copies_a_record_as_dataclasses_does_without_loading_it():
    """records.replace of a record runs its __init__ (post-init and the cached hash included) and gives what
    dataclasses.replace gives; a change naming no init field is refused as dataclasses refuses it. In a
    fresh interpreter it loads no ``dataclasses`` (3-4 ms, on a cold run's row-table reshape)."""
    import subprocess
    import sys

    @record(frozen=True, slots=True, cache_hash=True)
    class K:
        a: int
        b: tuple = ()
        c: int = records.field(init=False, default=0, compare=False)

        def __post_init__(self):
            object.__setattr__(self, "c", self.a * 2)

    k = K(1, (2,))
    for changes in ({}, {"a": 3}, {"b": (4, 5)}, {"a": 6, "b": ()}):
        ours, theirs = records.replace(k, **changes), dataclasses.replace(k, **changes)
        assert (ours.a, ours.b, ours.c, hash(ours), repr(ours)) == (theirs.a, theirs.b, theirs.c, hash(theirs),
                                                                     repr(theirs))
    for bad in ({"c": 1}, {"d": 1}):
        with pytest.raises((TypeError, ValueError)):
            records.replace(k, **bad)
    code = ("from __future__ import annotations\nimport sys\nfrom onnx_prepared.records import record, replace\n"
            "@record(frozen=True, slots=True)\nclass P:\n    x: int\n    y: int = 0\n"
            "assert replace(P(1, 2), y=3) == P(1, 3)\nprint('dataclasses' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
