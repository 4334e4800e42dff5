"""Prepared execution at run time: session state, submissions, the cold and hot paths."""

from onnx_prepared.runtime.session import RuntimeSession
from onnx_prepared.runtime.state import ExecutionSubmission, PreparedExecutionState

__all__ = ["ExecutionSubmission", "PreparedExecutionState", "RuntimeSession"]
