"""``onnxruntime.capi._pybind_state``: re-exports :mod:`.onnxruntime_pybind11_state`, as onnxruntime's does."""

from onnx_prepared.capi.onnxruntime_pybind11_state import *  # noqa: F403
from onnx_prepared.capi.onnxruntime_pybind11_state import (  # noqa: F401
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    NoSuchFile,
    NotImplemented,
    RuntimeException,
)
