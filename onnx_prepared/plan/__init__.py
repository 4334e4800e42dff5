"""Planning: the one immutable, scope-aware PreparedExecutionPlan of session and invocation tasks.

Its invocation tasks are ranges of the resolved graph's frozen ExecutionPlan (built in
:mod:`onnx_prepared.bind`).
"""

from onnx_prepared.plan.prepared_plan import (
    PlanError,
    PreparedExecutionPlan,
    TaskDescriptor,
    TaskKind,
    TaskScope,
    build_prepared_plan,
)

__all__ = ["PlanError", "PreparedExecutionPlan", "TaskDescriptor", "TaskKind", "TaskScope", "build_prepared_plan"]
