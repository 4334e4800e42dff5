"""Model loading: metadata-only parse, weight descriptors, validated on-demand external-data reads."""

from onnx_prepared.model.checksum import recorded_sha256, sha256_hex, verify_checksum
from onnx_prepared.model.descriptors import ExternalPayload, InlinePayload, WeightDescriptor, expected_nbytes
from onnx_prepared.model.loader import (
    LoadedModel,
    NestedExternal,
    describe_model,
    inline_nested_external,
    load_model,
    load_model_bytes,
)
from onnx_prepared.model.reader import ExternalDataReader

__all__ = [
    "ExternalDataReader",
    "ExternalPayload",
    "InlinePayload",
    "LoadedModel",
    "NestedExternal",
    "WeightDescriptor",
    "describe_model",
    "expected_nbytes",
    "inline_nested_external",
    "load_model",
    "load_model_bytes",
    "recorded_sha256",
    "sha256_hex",
    "verify_checksum",
]
