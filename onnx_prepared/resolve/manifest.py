"""The minimal payload manifest, and the one reader that enforces it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from onnx_prepared.errors import ManifestError
from onnx_prepared.model import ExternalDataReader, WeightDescriptor
from onnx_prepared.records import field, record


@record(frozen=True, slots=True)
class ManifestEntry:
    """One payload the plan may read, and why (:attr:`reason`)."""

    name: str
    descriptor: WeightDescriptor | None  # None for a packed payload of the companion model
    #: the reason as a str, or the :class:`Why` it is spelt out from when asked (inspect, tests: a run never)
    why: Any
    cache_entry: Any = None  # the companion store's CacheEntry, for packed payloads
    #: a reason of its own: rows of this payload are read on demand (resolve/rows.py), "" otherwise
    rows: str = ""

    @property
    def reason(self) -> str:
        return self.why if type(self.why) is str else str(self.why)


class Why:
    """Why a source is in the manifest: the first consumer of one prepared object (``key``) reads it;
    spelt out on ``str()`` (a resolution makes one per object: formatting ~13 of them was ~10 us of a
    small quantized CNN's construction, read by ``inspect`` alone)."""

    __slots__ = ("key", "node")

    def __init__(self, key: Any, node: tuple[str, str, str] | None) -> None:
        self.key, self.node = key, node  # node: the first consumer's (name, domain, op_type); None: an output

    def __str__(self) -> str:
        key, node = self.key, self.node
        why = f"source of {key}" if not key.is_raw else "constant input"
        return why + (f" of node {node[0] or node[2]!r}" if node is not None else " (graph output)")

    def __repr__(self) -> str:
        return repr(str(self))


@record(frozen=True, slots=True)
class PayloadManifest:
    """Active entries may be read; dormant ones are fallbacks kept addressable; dead ones are absent."""

    active: Mapping[str, ManifestEntry]
    dormant: Mapping[str, ManifestEntry] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def active_bytes(self) -> int:
        return sum(e.descriptor.nbytes if e.descriptor is not None else e.cache_entry.length
                   for e in self.active.values())


class ManifestReader:
    """Reads payloads through an :class:`ExternalDataReader`, refusing any that is not active.

    Thread-safe (the underlying reader is). ``counts`` records reads per tensor for tests and traces.
    """

    def __init__(self, manifest: PayloadManifest, reader: ExternalDataReader | None = None) -> None:
        self.manifest = manifest
        self.reader = reader or ExternalDataReader()
        self.counts: dict[str, int] = {}
        self.fallbacks: set[str] = set()
        self.session_entries: dict[str, ManifestEntry] = {}

    def allow_fallback(self, name: str) -> None:
        """Activate a dormant entry because its cheaper recipe failed (e.g. a corrupt cache payload)."""
        if name in self.manifest.dormant:
            self.fallbacks.add(name)

    def add_session_entry(self, name: str, cache_entry: Any) -> None:
        """A packed payload this session persisted itself (the restore tier of eviction) becomes readable."""
        self.session_entries[name] = ManifestEntry(name, None, "persisted by this session", cache_entry)

    def _entry(self, name: str) -> ManifestEntry:
        entry = self.manifest.active.get(name) or self.session_entries.get(name)
        if entry is None and name in self.fallbacks:
            entry = self.manifest.dormant[name]
        if entry is None:
            state = "dormant" if name in self.manifest.dormant else "not in the payload manifest"
            raise ManifestError(f"read of payload {name!r} refused: it is {state}")
        self.counts[name] = self.counts.get(name, 0) + 1
        return entry

    def read(self, name: str) -> np.ndarray:
        entry = self._entry(name)
        if entry.descriptor is None:
            raise ManifestError(f"payload {name!r} is a packed cache entry; read it with read_packed")
        return self.reader.read(entry.descriptor)

    def read_packed(self, name: str, store: Any) -> np.ndarray:
        """The bytes of an active packed payload from the companion store (checksum verified there)."""
        entry = self._entry(name)
        if entry.cache_entry is None:
            raise ManifestError(f"payload {name!r} is a source tensor, not a packed cache entry")
        return store.read_payload(entry.cache_entry)

    def close(self) -> None:
        self.reader.close()
