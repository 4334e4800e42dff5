"""Binding: every node's kernel chosen once, its attributes settled, subgraphs turned into plans.

``kernel`` chooses a node's fast kernel or the ``onnx.reference`` fallback (``reference``: the adapter
and its patches, imported only when a node needs it; ``fallback_env``: the state a graph's fallback
nodes share); ``graph`` binds a whole graph into the frozen, slot-indexed ``ExecutionPlan``
(``execution_plan``) and supplies the fallback's subgraph factory. Resolution calls this layer once
per node and stores the result in the frozen ``ResolvedModel``; nothing above it binds again.
"""

from onnx_prepared.bind.attributes import parse_attributes
from onnx_prepared.bind.execution_plan import NONE_SLOT, ExecuteAction, ExecutionPlan, live_bytes
from onnx_prepared.bind.fallback_env import FALLBACK_CALLS, FallbackEnv, bind_fallback
from onnx_prepared.bind.graph import SubgraphEvaluator, bind_node, build_execution_plan, graph_env
from onnx_prepared.bind.kernel import BoundKernel, bind_kernel, node_opset
from onnx_prepared.bind.scopes import implicit_inputs_of, subgraph_outer_names

__all__ = [
    "FALLBACK_CALLS",
    "NONE_SLOT",
    "BoundKernel",
    "ExecuteAction",
    "ExecutionPlan",
    "FallbackEnv",
    "SubgraphEvaluator",
    "bind_fallback",
    "bind_kernel",
    "bind_node",
    "build_execution_plan",
    "graph_env",
    "implicit_inputs_of",
    "live_bytes",
    "node_opset",
    "parse_attributes",
    "subgraph_outer_names",
]
