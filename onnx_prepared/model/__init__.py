"""Model loading: metadata-only parse, weight descriptors, validated on-demand external-data reads."""

from onnx_prepared.model.descriptors import ExternalPayload, InlinePayload, WeightDescriptor
from onnx_prepared.model.loader import LoadedModel, load_model
from onnx_prepared.model.reader import ExternalDataReader

__all__ = ["ExternalDataReader", "ExternalPayload", "InlinePayload", "LoadedModel", "WeightDescriptor", "load_model"]
