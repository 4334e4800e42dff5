"""onnx-prepared: an ONNX inference runtime built for fast cold start."""

from onnx_prepared.errors import (
    Cancelled,
    ExternalDataError,
    InvalidFeedError,
    KernelError,
    ModelLoadError,
    OnnxPreparedError,
    UnsupportedOpError,
)
from onnx_prepared.options import SessionOptions
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.session import InferenceSession, NodeArg

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "ExternalDataError",
    "InferenceSession",
    "InvalidFeedError",
    "KernelError",
    "ModelLoadError",
    "NodeArg",
    "OnnxPreparedError",
    "RuntimeSession",
    "SessionOptions",
    "UnsupportedOpError",
]
