"""Planning: the sequential ExecutionPlan (and, later, the scope-aware PreparedExecutionPlan)."""

from onnx_prepared.plan.execution_plan import ExecuteAction, ExecutionPlan, build_execution_plan

__all__ = ["ExecuteAction", "ExecutionPlan", "build_execution_plan"]
