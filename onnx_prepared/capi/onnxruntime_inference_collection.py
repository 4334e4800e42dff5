"""``onnxruntime.capi.onnxruntime_inference_collection``: the Python classes onnxruntime defines there."""

from onnx_prepared.compat.iobinding import IOBinding  # noqa: F401
from onnx_prepared.compat.ortvalue import OrtValue  # noqa: F401
from onnx_prepared.inference_session import InferenceSession, ModelMetadata, NodeArg  # noqa: F401
