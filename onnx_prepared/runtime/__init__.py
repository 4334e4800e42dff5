"""Prepared execution at run time: construction (builder), the session, inference's hot and cold paths,
session tasks (producers) and the mutable session state."""

from onnx_prepared.runtime.context import RuntimeContext
from onnx_prepared.runtime.session import RuntimeSession
from onnx_prepared.runtime.state import ExecutionSubmission, PreparedExecutionState

__all__ = ["ExecutionSubmission", "PreparedExecutionState", "RuntimeContext", "RuntimeSession"]
