"""The operator-schema facts load-time validation reads, without onnx's schema registry on the common path.

Validation (:mod:`~onnx_prepared.model.versions`, :mod:`~onnx_prepared.model.types`) needs a few facts
per (domain, op, opset): the schema's version, input counts, declared attributes and their types, type
constraints and formal parameters. onnx's registry answers them, but loading its C++ extension and
building the registry costs about 9 ms per process (1.8 ms + 7.3 ms for the first lookup, measured on
this machine), a fifth of our start-up import. The facts are a pure function of the installed onnx
build, so they are cached in one small file per build (``$XDG_CACHE_HOME/onnx-prepared/schemas``,
named by the extension's path, size and mtime and by the interpreter's version), filled with the lookups
models make and written atomically (temporary file + ``os.replace``) when a lookup missed. A corrupt,
foreign or unreadable file is ignored (the registry answers), an unwritable folder is skipped. Lookups
whose answer is an error (an op its opset does not define) always go to the registry, which words the
message.

The file is ``marshal`` data named by a CRC (:mod:`~onnx_prepared.model.cache_files`), because the first
session of a process reads it: ``json`` and OpenSSL's ``hashlib`` would load for it (1.4 + 2.2-2.8 ms,
measured on this machine), and ``json.loads`` of a 90 KB file took 1.5 ms against ``marshal.loads``' 0.5.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.model import cache_files

_LIMIT = 4 << 20  # a cache file is a few hundred bytes per op


class Formal:
    """One formal input or output: its type string (``T`` or ``tensor(int64)``), variadic, homogeneous."""

    __slots__ = ("homogeneous", "type_str", "variadic")

    def __init__(self, type_str: str, variadic: bool, homogeneous: bool) -> None:
        self.type_str, self.variadic, self.homogeneous = type_str, variadic, homogeneous


class Schema:
    """What validation reads of one operator schema (see the module docstring)."""

    __slots__ = ("attributes", "constraints", "inputs", "max_input", "min_input", "outputs", "since_version")

    def __init__(self, since_version: int, min_input: int, max_input: int, attributes: dict[str, tuple[int, str]],
                 constraints: dict[str, frozenset[str]], inputs: tuple[Formal, ...], outputs: tuple[Formal, ...]):
        self.since_version, self.min_input, self.max_input = since_version, min_input, max_input
        #: attribute name -> (AttributeProto type, its name)
        self.attributes = attributes
        #: type parameter -> allowed type strings
        self.constraints = constraints
        self.inputs, self.outputs = inputs, outputs

    def to_json(self) -> list:
        return [self.since_version, self.min_input, self.max_input, {k: list(v) for k, v in self.attributes.items()},
                {k: sorted(v) for k, v in self.constraints.items()},
                [[f.type_str, f.variadic, f.homogeneous] for f in self.inputs],
                [[f.type_str, f.variadic, f.homogeneous] for f in self.outputs]]

    @classmethod
    def from_json(cls, v: list) -> Schema:
        since, lo, hi, attrs, cons, ins, outs = v
        return cls(int(since), int(lo), int(hi), {str(k): (int(t), str(n)) for k, (t, n) in attrs.items()},
                   {str(k): frozenset(map(str, a)) for k, a in cons.items()},
                   tuple(Formal(str(t), bool(va), bool(h)) for t, va, h in ins),
                   tuple(Formal(str(t), bool(va), bool(h)) for t, va, h in outs))

    @classmethod
    def from_registry(cls, s) -> Schema:
        variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic

        def formals(ps) -> tuple[Formal, ...]:
            return tuple(Formal(p.type_str, p.option == variadic, bool(p.is_homogeneous)) for p in ps)

        return cls(int(s.since_version), int(s.min_input), int(s.max_input),
                   {n: (int(a.type.value), a.type.name) for n, a in s.attributes.items()},
                   {c.type_param_str: frozenset(c.allowed_type_strs) for c in s.type_constraints},
                   formals(s.inputs), formals(s.outputs))


class NotInOpset(LookupError):
    """The op exists in the domain, but the requested opset does not define it (ask the registry why)."""


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnx-prepared", "schemas")


class SchemaCache:
    """Schema facts of one onnx build: from the cache file, else from the registry (then saved)."""

    def __init__(self, folder: str | None, build: str | None) -> None:
        self._lock = threading.Lock()
        self._build = build
        self._path = os.path.join(folder, _file_name(build)) if folder is not None and build is not None else None
        self._ops: dict[str, list | None] = {}  # as in the file
        self._decoded: dict[str, Schema | None] = {}  # the lookups decoded so far (each key once)
        self._opsets: dict[str, int] = {}
        self._dirty = False
        self._load()

    def _load(self) -> None:
        if self._path is None:
            return
        with contextlib.suppress(OSError, AttributeError, *cache_files.LOAD_ERRORS):
            with open(self._path, "rb") as f:
                data = cache_files.load(f.read(_LIMIT))
            if data.get("build") == self._build:
                self._ops = dict(data["ops"])
                self._opsets = {str(k): int(v) for k, v in data["opsets"].items()}

    def max_opset(self, domain: str) -> int:
        """Highest opset of an onnx-defined ``domain`` ("" or "ai.onnx.ml" or another onnx domain)."""
        v = self._opsets.get(domain)
        if v is None:
            if domain == "":
                v = onnx.defs.onnx_opset_version()
            elif domain == "ai.onnx.ml":
                v = onnx.defs.onnx_ml_opset_version()
            else:
                v = max((s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.domain == domain),
                        default=0)
            with self._lock:
                self._opsets[domain] = int(v)
                self._dirty = True
        return v

    def lookup(self, op_type: str, version: int, domain: str) -> Schema | None:
        """The schema of ``op_type`` at opset ``version`` of ``domain``; None: the domain has no such op.

        Raises NotInOpset when the op exists but that opset does not define it."""
        key = f"{domain}|{op_type}|{version}"
        found = self._decoded.get(key, self)
        if found is not self:
            return found
        try:
            v = self._ops[key]
        except KeyError:
            pass
        else:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                found = self._decoded[key] = None if v is None else Schema.from_json(v)
                return found
        if not onnx.defs.has(op_type, domain):
            found = None
        else:
            try:
                found = Schema.from_registry(onnx.defs.get_schema(op_type, version, domain))
            except onnx.defs.SchemaError:
                raise NotInOpset(key) from None
        with self._lock:
            self._ops[key] = None if found is None else found.to_json()
            self._decoded[key] = found
            self._dirty = True
        return found

    def flush(self) -> None:
        """Write the file if a lookup missed since it was read (a cache: any OSError is ignored)."""
        if not self._dirty or self._path is None:
            return
        with self._lock:
            body = cache_files.dump({"build": self._build, "opsets": self._opsets, "ops": self._ops})
            self._dirty = False
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            cache_files.write_atomic(self._path, body)


def _file_name(build: str) -> str:
    """The cache file of ``build`` for this interpreter (the file records the build it holds)."""
    v = sys.version_info
    return cache_files.crc_name(f"{build}|{v[0]}.{v[1]}|marshal{cache_files.MARSHAL_VERSION}") + ".marshal"


_CACHE: SchemaCache | None = None
_CACHE_LOCK = threading.Lock()


def cache() -> SchemaCache:
    """The process's schema cache (created on first use)."""
    global _CACHE
    with _CACHE_LOCK:
        if _CACHE is None:
            _CACHE = SchemaCache(default_dir(), onnx.schema_build())
        return _CACHE
