"""``onnxruntime.capi.onnxruntime_pybind11_state``: the exception classes and native types.

Exceptions are onnx-prepared's own error classes, so ``except InvalidArgument`` catches what we raise
for a bad feed: InvalidArgument is InvalidFeedError, Fail is OnnxPreparedError (the base of every error
we raise), NoSuchFile and InvalidProtobuf are ModelLoadError, NotImplemented is UnsupportedOpError,
RuntimeException is KernelError. The rest are distinct subclasses we never raise.
"""

from __future__ import annotations

from onnx_prepared.compat.api import (  # noqa: F401
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    OrtAllocatorType,
    OrtMemType,
    RunOptions,
    disable_telemetry_events,
    enable_telemetry_events,
    get_all_providers,
    get_available_providers,
    get_build_info,
    get_device,
    get_version_string,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_global_thread_pool_sizes,
    set_seed,
)
from onnx_prepared.compat.iobinding import IOBinding as SessionIOBinding  # noqa: F401
from onnx_prepared.compat.ortvalue import OrtValue  # noqa: F401
from onnx_prepared.errors import (
    InvalidFeedError,
    KernelError,
    ModelLoadError,
    OnnxPreparedError,
    UnsupportedOpError,
)
from onnx_prepared.inference_session import InferenceSession, ModelMetadata, NodeArg  # noqa: F401
from onnx_prepared.options import SessionOptions

Fail = OnnxPreparedError
InvalidArgument = InvalidFeedError
NoSuchFile = ModelLoadError
InvalidProtobuf = ModelLoadError
NotImplemented = UnsupportedOpError  # onnxruntime's name (shadows the builtin here only)
RuntimeException = KernelError


class NoModel(OnnxPreparedError):
    pass


class ModelLoaded(OnnxPreparedError):
    pass


class EngineError(OnnxPreparedError):
    pass


class InvalidGraph(ModelLoadError):
    pass


class EPFail(OnnxPreparedError):
    pass


class NotFound(OnnxPreparedError):
    pass


class ModelLoadCanceled(OnnxPreparedError):
    pass


class ModelRequiresCompilation(OnnxPreparedError):
    pass


def _unavailable(name: str):
    def call(*_args, **_kwargs):
        raise NotImplementedError(f"onnxruntime.capi.{name} is native onnxruntime code that onnx-prepared does not "
                                  "provide (use onnxruntime itself for this step)")

    call.__name__ = name
    return call


# Native helpers some onnxruntime Python tools import at module level: importable, fail when called.
quantize_matmul_2bits = _unavailable("quantize_matmul_2bits")
quantize_matmul_4bits = _unavailable("quantize_matmul_4bits")
quantize_matmul_8bits = _unavailable("quantize_matmul_8bits")
quantize_qdq_matmul_2bits = _unavailable("quantize_qdq_matmul_2bits")
quantize_qdq_matmul_4bits = _unavailable("quantize_qdq_matmul_4bits")
quantize_matmul_bnb4 = _unavailable("quantize_matmul_bnb4")
register_execution_provider_library = _unavailable("register_execution_provider_library")
unregister_execution_provider_library = _unavailable("unregister_execution_provider_library")
get_all_operator_schema = _unavailable("get_all_operator_schema")
get_all_opkernel_def = _unavailable("get_all_opkernel_def")


def get_ep_devices() -> list:
    """No execution-provider devices besides the implicit CPU one."""
    return []


def has_collective_ops() -> bool:
    return False


def get_default_session_options() -> SessionOptions:
    return SessionOptions()
