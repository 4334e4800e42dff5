"""The minimal payload manifest, and the one reader that enforces it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from onnx_prepared.errors import ManifestError
from onnx_prepared.model import ExternalDataReader, WeightDescriptor


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One payload the plan may read, and why."""

    name: str
    descriptor: WeightDescriptor
    reason: str


@dataclass(frozen=True, slots=True)
class PayloadManifest:
    """Active entries may be read; dormant ones are fallbacks kept addressable; dead ones are absent."""

    active: Mapping[str, ManifestEntry]
    dormant: Mapping[str, ManifestEntry] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def active_bytes(self) -> int:
        return sum(e.descriptor.nbytes for e in self.active.values())


class ManifestReader:
    """Reads payloads through an :class:`ExternalDataReader`, refusing any that is not active.

    Thread-safe (the underlying reader is). ``counts`` records reads per tensor for tests and traces.
    """

    def __init__(self, manifest: PayloadManifest, reader: ExternalDataReader | None = None) -> None:
        self.manifest = manifest
        self.reader = reader or ExternalDataReader()
        self.counts: dict[str, int] = {}

    def _entry(self, name: str) -> ManifestEntry:
        entry = self.manifest.active.get(name)
        if entry is None:
            state = "dormant" if name in self.manifest.dormant else "not in the payload manifest"
            raise ManifestError(f"read of payload {name!r} refused: it is {state}")
        self.counts[name] = self.counts.get(name, 0) + 1
        return entry

    def read(self, name: str) -> np.ndarray:
        return self.reader.read(self._entry(name).descriptor)

    def close(self) -> None:
        self.reader.close()
