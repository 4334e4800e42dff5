"""Prepared objects: the store (one generation record per key), the residency policy that picks
eviction victims, and the companion-model cache (``cache*``) that persists packed payloads."""

from onnx_prepared.prepared.store import EntryState, PreparedEntry, PreparedObjectStore, ReadEntry

__all__ = ["EntryState", "PreparedEntry", "PreparedObjectStore", "ReadEntry"]
