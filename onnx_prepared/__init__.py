"""onnx-prepared: an ONNX inference runtime built for fast cold start."""

from onnx_prepared.errors import (
    Cancelled,
    ExternalDataError,
    InvalidFeedError,
    InvalidOptionError,
    KernelError,
    ModelLoadError,
    OnnxPreparedError,
    UnsupportedOpError,
)
from onnx_prepared.options import SessionOptions

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "CancelledError",
    "ExternalDataError",
    "InferenceSession",
    "InvalidFeedError",
    "InvalidOptionError",
    "KernelError",
    "ModelLoadError",
    "NodeArg",
    "OnnxPreparedError",
    "RuntimeSession",
    "SessionOptions",
    "UnsupportedOpError",
]

# The sessions and onnxruntime's module-level names load on first access: `import onnx_prepared` (and
# so every CLI command's start, `--help` included) stays light, and a session's modules load with it.
_API = "onnx_prepared.compat.api"
_LAZY = {
    "CancelledError": "onnx_prepared.errors",  # built on first use (errors.py: its base imports logging)
    "InferenceSession": "onnx_prepared.inference_session",
    "NodeArg": "onnx_prepared.inference_session",
    "RuntimeSession": "onnx_prepared.runtime",
    **dict.fromkeys(
        ("GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "OrtAllocatorType", "OrtMemType", "RunOptions",
         "get_available_providers", "get_all_providers", "get_device", "get_version_string", "get_build_info",
         "disable_telemetry_events", "enable_telemetry_events", "set_default_logger_severity",
         "set_default_logger_verbosity", "set_seed", "set_global_thread_pool_sizes"), _API),
    "OrtValue": "onnx_prepared.compat.ortvalue",
    "IOBinding": "onnx_prepared.compat.iobinding",
    "SessionIOBinding": "onnx_prepared.compat.iobinding",
    "ModelMetadata": "onnx_prepared.inference_session",
}


def __getattr__(name: str):
    import importlib

    if name == "capi":
        return importlib.import_module("onnx_prepared.capi")
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'onnx_prepared' has no attribute {name!r}")
    attr = "IOBinding" if name == "SessionIOBinding" else name
    import gc

    # NOTE: the cyclic collector ran ~17 times during a session's import (thousands of new functions and
    # classes, none of them garbage); paused, the import measured ~5 ms faster (55 vs 60 ms, medians of
    # 12 fresh interpreters, load ~9). A caller's own gc.disable() is left as it is.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        value = getattr(importlib.import_module(where), attr)
    finally:
        if paused:
            gc.enable()
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"capi"})

