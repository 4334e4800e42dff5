"""Prepared execution at run time: construction (builder), the session, inference's hot and cold paths,
session tasks (producers), the mutable session state and the per-run ExecutionFrame."""

from onnx_prepared.runtime.context import RuntimeContext
from onnx_prepared.runtime.frame import ExecutionFrame
from onnx_prepared.runtime.session import RuntimeSession
from onnx_prepared.runtime.state import PreparedExecutionState

__all__ = ["ExecutionFrame", "PreparedExecutionState", "RuntimeContext", "RuntimeSession"]
