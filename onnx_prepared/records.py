"""``record``: ``dataclasses.dataclass`` for the start-up path, at a seventh of its class-creation cost.

``dataclass`` compiles each generated method (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
frozen ``__setattr__``/``__delattr__``) with a separate ``exec``, and ``slots=True`` builds the class
twice: about 0.4 ms per frozen class, 13 ms over the 34 classes constructing a session imports (a third
of our import). ``record`` compiles only ``__init__`` (compiling is what class creation costs; one
generated method in one ``exec``), makes the other methods closures over the field names (their reads
are one ``operator.attrgetter`` call) and builds a slotted class once.
``dataclasses.fields``/``replace``/``asdict`` keep working: ``__dataclass_fields__`` is computed on first
access by running ``dataclass`` itself on a shadow copy of the class (only introspection pays for it).
The ``dataclasses`` module itself (with ``inspect``, ``dis`` and ``ast``: 3-4 ms) loads only then, or for
a class ``record`` hands over: declare fields with this module's :func:`field` and copy with
:func:`replace`.

Supported: positional fields with plain defaults or ``field(default=..., default_factory=...,
init=..., compare=..., repr=..., hash=...)``, ``frozen``, ``eq``, ``slots``, ``__post_init__``, no
base class with fields. ``cache_hash=True`` (frozen, slotted records of hashable fields only; not a
``dataclass`` argument) computes the hash once at construction and keeps it in a hidden slot (pickle and
copy recompute it): for keys hashed many times over (a PreparedKey ~9 times a session construction).
Anything else (``kw_only``, ``order``, ``InitVar``, ``ClassVar``, field metadata, inheritance) is
handed to ``dataclasses.dataclass`` unchanged, so a record is never a different thing.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from typing import Any


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Any = _Missing()


class _Field:
    """What :func:`field` declares (``dataclasses.Field``'s attributes, without importing dataclasses)."""

    __slots__ = ("compare", "default", "default_factory", "hash", "init", "kw_only", "metadata", "repr")

    def __init__(self, default, default_factory, init, repr, hash, compare, metadata, kw_only) -> None:
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.default, self.default_factory, self.init, self.repr = default, default_factory, init, repr
        self.hash, self.compare, self.metadata, self.kw_only = hash, compare, metadata, kw_only


def field(*, default: Any = _MISSING, default_factory: Any = _MISSING, init: bool = True, repr: bool = True,
          hash: bool | None = None, compare: bool = True, metadata: Any = None, kw_only: Any = _MISSING) -> Any:
    """``dataclasses.field`` for a :func:`record` (converted to a real one if ``dataclasses`` builds the class)."""
    return _Field(default, default_factory, init, repr, hash, compare, metadata, kw_only)


def replace(obj: Any, /, **changes: Any) -> Any:
    """``dataclasses.replace``: a record built by :func:`record` itself is copied through its ``__init__``
    (its init fields, then ``changes``) without loading ``dataclasses`` (3-4 ms, on a cold run's first row
    table reshape); anything else, or a change that names no init field, goes to ``dataclasses.replace``
    (which raises what it raises)."""
    names = getattr(type(obj), _INIT_FIELDS, None)
    if names is not None and changes.keys() <= set(names):
        return type(obj)(**{n: changes[n] if n in changes else getattr(obj, n) for n in names})
    import dataclasses

    return dataclasses.replace(obj, **changes)


#: the class attribute naming a record's init fields, in order (set by :func:`record` only)
_INIT_FIELDS = "__record_init_fields__"


def _as_field(v: Any) -> _Field | None:
    """``v`` as a :class:`_Field` if it declares a field (ours or a ``dataclasses.Field``), else None."""
    if isinstance(v, _Field):
        return v
    dc = sys.modules.get("dataclasses")
    if dc is not None and isinstance(v, dc.Field):
        def own(x):
            return _MISSING if x is dc.MISSING else x

        return _Field(own(v.default), own(v.default_factory), v.init, v.repr, v.hash, v.compare,
                      v.metadata or None, own(v.kw_only))
    return None


def _to_dataclasses(v: Any) -> Any:
    """A :class:`_Field` as a ``dataclasses.field`` (anything else unchanged)."""
    if not isinstance(v, _Field):
        return v
    import dataclasses

    def theirs(x):
        return dataclasses.MISSING if x is _MISSING else x

    return dataclasses.field(default=theirs(v.default), default_factory=theirs(v.default_factory), init=v.init,
                             repr=v.repr, hash=v.hash, compare=v.compare, metadata=v.metadata,
                             kw_only=theirs(v.kw_only))


def _frozen() -> type:
    import dataclasses

    return dataclasses.FrozenInstanceError


def _annotations(cls: type) -> dict[str, Any]:
    return dict(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063 (inspect is what we avoid loading)


class _LazyFields:
    """``__dataclass_fields__`` (and ``__dataclass_params__``) computed from a shadow dataclass on first use."""

    def __init__(self, attr: str, spec: dict[str, Any]) -> None:
        self.attr, self.spec = attr, spec

    def __get__(self, obj: Any, owner: type) -> Any:
        import dataclasses

        spec = self.spec
        defaults = {k: _to_dataclasses(v) for k, v in spec["defaults"].items()}
        shadow = dataclasses.dataclass(frozen=spec["frozen"], eq=spec["eq"])(
            type(owner.__name__, (), {"__annotations__": spec["annotations"], **defaults}))
        for attr in ("__dataclass_fields__", "__dataclass_params__"):
            setattr(owner, attr, getattr(shadow, attr))
        return getattr(owner, self.attr)


def _plain(cls: type, kwargs: dict[str, Any]) -> bool:
    """Whether ``record`` can build ``cls`` itself (see the module docstring)."""
    if set(kwargs) - {"frozen", "eq", "slots", "repr"} or not kwargs.get("repr", True):
        return False
    if any("__dataclass_fields__" in vars(b) or getattr(b, "__slots__", ()) for b in cls.__mro__[1:-1]):
        return False
    for name, ann in _annotations(cls).items():
        if not isinstance(ann, str) or ann.startswith(("ClassVar", "InitVar", "dataclasses.", "KW_ONLY", "typing.")):
            return False
        f = _as_field(cls.__dict__.get(name, _MISSING))
        if f is not None and (f.kw_only is True or f.metadata):
            return False
    return True


def _tuple_getter(names: list[str]) -> Callable[[Any], tuple]:
    """``lambda obj: (obj.a, obj.b, ...)``, as the generated methods of ``dataclasses`` compare and hash."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        get1 = operator.attrgetter(names[0])
        return lambda obj: (get1(obj),)
    return operator.attrgetter(*names)


def _repr_of(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    return __repr__


def _eq_of(get: Callable[[Any], tuple]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return get(self) == get(other)

    return __eq__


def _hash_of(get: Callable[[Any], tuple]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(get(self))

    return __hash__


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise _frozen()(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise _frozen()(f"cannot delete field {name!r}")


def _state_of(names: tuple[str, ...], hashed: list[str] | None = None) -> tuple[Callable, Callable]:
    """``__getstate__``/``__setstate__`` over the fields; with ``hashed`` (a cache_hash record), the
    restored object's hash is computed again (str hashes differ between processes)."""
    get = _tuple_getter(list(names))
    rehash = _tuple_getter(hashed) if hashed is not None else None

    def __getstate__(self: Any) -> list:
        return list(get(self))

    def __setstate__(self: Any, state: list) -> None:
        for n, v in zip(names, state):
            object.__setattr__(self, n, v)
        if rehash is not None:
            object.__setattr__(self, _HASH_SLOT, hash(rehash(self)))

    return __getstate__, __setstate__


#: the hidden slot of a ``cache_hash`` record (not a field: not compared, shown, pickled or replaced)
_HASH_SLOT = "_record_hash"


def _cached_hash_of() -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return self._record_hash

    return __hash__


def record(cls: type | None = None, /, **kwargs: Any) -> Any:
    """``@record(frozen=True, slots=True)``: as ``@dataclass(...)`` with the same arguments."""
    if cls is None:
        return lambda c: record(c, **kwargs)
    cache_hash = kwargs.pop("cache_hash", False)
    if cache_hash and not (kwargs.get("frozen") and kwargs.get("slots") and kwargs.get("eq", True)
                           and _plain(cls, kwargs)):
        raise TypeError("cache_hash needs a plain frozen, slotted record with eq")
    if not _plain(cls, kwargs):
        import dataclasses

        for n, v in list(cls.__dict__.items()):
            if isinstance(v, _Field):
                setattr(cls, n, _to_dataclasses(v))
        return dataclasses.dataclass(cls, **kwargs)
    frozen, eq, slots = kwargs.get("frozen", False), kwargs.get("eq", True), kwargs.get("slots", False)
    annotations = _annotations(cls)
    names = list(annotations)
    defaults: dict[str, Any] = {}  # name -> dataclasses.Field or plain default, as declared
    ns: dict[str, Any] = {"_MISSING": _MISSING, "_setattr": object.__setattr__}
    params, body = [], []
    compared, shown, hashed, inits = [], [], [], []
    for n in names:
        v = cls.__dict__.get(n, _MISSING)
        f = _as_field(v)
        if f is None or f.init:
            inits.append(n)
        if v is not _MISSING:
            defaults[n] = v if f is None else f
        default = f.default if f is not None else v
        factory = f.default_factory if f is not None else _MISSING
        if f is not None and not f.init:  # set from its default here, or left to __post_init__
            if factory is not _MISSING:
                ns[f"_f_{n}"] = factory
                value = f"_f_{n}()"
            elif default is not _MISSING:
                ns[f"_d_{n}"] = default
                value = f"_d_{n}"
            else:
                value = None
        elif factory is not _MISSING:
            ns[f"_f_{n}"] = factory
            params.append(f"{n}=_MISSING")
            value = f"_f_{n}() if {n} is _MISSING else {n}"
        elif default is not _MISSING:
            ns[f"_d_{n}"] = default
            params.append(f"{n}=_d_{n}")
            value = n
        else:
            if any("=" in p for p in params):
                raise TypeError(f"non-default argument {n!r} follows default argument")
            params.append(n)
            value = n
        if value is not None:
            if frozen and slots:  # the slot's own setter (bound below): a third cheaper than object.__setattr__
                body.append(f"  _s_{n}(self, {value})")
            else:
                body.append(f"  _setattr(self, {n!r}, {value})" if frozen else f"  self.{n} = {value}")
        if f is None or f.compare:
            compared.append(n)
            if f is None or f.hash is None or f.hash:
                hashed.append(n)
        elif f.hash:
            hashed.append(n)
        if f is None or f.repr:
            shown.append(n)
    if "__post_init__" in cls.__dict__:
        body.append("  self.__post_init__()")
    if cache_hash:  # after __post_init__, which may set fields
        ns["_hashed"] = _tuple_getter(hashed)
        body.append(f"  _s_{_HASH_SLOT}(self, hash(_hashed(self)))")
    qual = cls.__qualname__
    # Only __init__ is compiled (one small exec: compiling is what class creation costs); the other
    # methods are closures over the field names, with operator.attrgetter doing the reads in C.
    exec("\n".join([f"def __init__(self, {', '.join(params)}):", *(body or ["  pass"])]), ns)
    attrs: dict[str, Any] = {"__init__": ns["__init__"], "__repr__": _repr_of(tuple(shown))}
    if eq:
        attrs["__eq__"] = _eq_of(_tuple_getter(compared))
        if frozen:
            attrs["__hash__"] = _cached_hash_of() if cache_hash else _hash_of(_tuple_getter(hashed))
    if frozen:
        attrs["__setattr__"], attrs["__delattr__"] = _frozen_setattr, _frozen_delattr
    if frozen and slots:  # pickle and copy restore slots through setattr, which a frozen record refuses
        attrs["__getstate__"], attrs["__setstate__"] = _state_of(tuple(names), hashed if cache_hash else None)
    spec = {"frozen": frozen, "eq": eq, "annotations": annotations, "defaults": defaults}
    for m, fn in attrs.items():
        if m in ("__init__", "__repr__", "__eq__", "__hash__", "__getstate__", "__setstate__"):
            fn.__qualname__ = f"{qual}.{m}"
    if eq and not frozen:
        attrs["__hash__"] = None
    attrs["__match_args__"] = tuple(names)
    attrs[_INIT_FIELDS] = tuple(inits)
    attrs["__dataclass_fields__"] = _LazyFields("__dataclass_fields__", spec)
    attrs["__dataclass_params__"] = _LazyFields("__dataclass_params__", spec)
    if not slots:  # as dataclass: the same class, methods added; a plain default stays a class attribute
        for n, v in defaults.items():
            if isinstance(v, _Field):
                if v.default is _MISSING:
                    delattr(cls, n)
                else:
                    setattr(cls, n, v.default)
        for k, v in attrs.items():
            setattr(cls, k, v)
        return cls
    body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__") and k not in defaults}
    body.update(attrs, __slots__=(*names, _HASH_SLOT) if cache_hash else tuple(names))
    out = type(cls)(cls.__name__, cls.__bases__, body)
    out.__qualname__ = qual
    if frozen:
        for n in (*names, _HASH_SLOT) if cache_hash else names:  # __init__ reads these globals at call time
            ns[f"_s_{n}"] = out.__dict__[n].__set__
    return out
