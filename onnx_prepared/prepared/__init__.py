"""Prepared objects: the residency store (and, later, the companion-model cache)."""

from onnx_prepared.prepared.store import EntryState, PreparedEntry, PreparedObjectStore

__all__ = ["EntryState", "PreparedEntry", "PreparedObjectStore"]
