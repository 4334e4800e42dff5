"""Model resolution before weight loading: transformations, kernel choice, prepared keys, manifest."""

from onnx_prepared.resolve.keys import RAW, PreparedKey
from onnx_prepared.resolve.manifest import ManifestEntry, ManifestReader, PayloadManifest
from onnx_prepared.resolve.resolver import PreparedRequirement, ResolvedModel, resolve_model

__all__ = [
    "RAW",
    "ManifestEntry",
    "ManifestReader",
    "PayloadManifest",
    "PreparedKey",
    "PreparedRequirement",
    "ResolvedModel",
    "resolve_model",
]
