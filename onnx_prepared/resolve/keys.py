"""PreparedKey: the identity of one prepared object."""

from __future__ import annotations

import re

from onnx_prepared.records import field, record

#: Layout of a prepared object that is the source tensor itself (read -> publish, no prepack).
RAW = "raw"


@record(frozen=True, slots=True, cache_hash=True)  # a dict key ~9 times per construction
class PreparedKey:
    """(ordered source lineage, layout, device): identical requests share one key.

    ``lineage_digest`` (from the sources' external-data checksums, when every source has one) is the
    cache identity across processes; it is not part of in-session equality because within a session
    the sources cannot change.
    """

    lineage: tuple[str, ...]
    layout: str
    device: str = "cpu"
    lineage_digest: str | None = field(default=None, compare=False)

    @property
    def is_raw(self) -> bool:
        return self.layout == RAW

    def __str__(self) -> str:
        return f"{'+'.join(self.lineage)}@{self.layout}"

    @property
    def slot_name(self) -> str:
        """Value name of the prepared object in the execution plan (cannot clash with ONNX names)."""
        return f"prepared/{self}"

    @property
    def file_safe(self) -> str:
        """A short, stable, filesystem-safe name (for cache payload names)."""
        import hashlib  # (1.5-2 ms of OpenSSL loading, lazily: the first cache key, not every import)

        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.lineage[0])[:60]
        h = hashlib.sha256(f"{self.lineage}|{self.layout}|{self.device}".encode()).hexdigest()[:16]
        return f"{base}-{h}"


def lineage_digest(checksums: list[str | None], names: tuple[str, ...], types: list[str]) -> str | None:
    """Aggregate digest over ordered source identities, types and content checksums; None if any is unknown."""
    if any(c is None for c in checksums):
        return None
    import hashlib

    h = hashlib.sha256()
    for n, t, c in zip(names, types, checksums):
        h.update(f"{n}\0{t}\0{c}\n".encode())
    return h.hexdigest()
