"""The state every fallback node of one graph shares, without importing ``onnx.reference``.

Every graph gets a :class:`FallbackEnv` at binding (:func:`onnx_prepared.bind.graph.graph_env`), even
when none of its nodes falls back; ``onnx.reference`` (about 50 ms to import) loads only when one does,
through :mod:`onnx_prepared.bind.reference`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onnx_prepared import onnx_proto as onnx

#: op name -> number of fallback invocations in this process (diagnostics, `inspect`).
FALLBACK_CALLS: collections.Counter[str] = collections.Counter()

#: Builds the evaluator of a plain subgraph (If/Loop/Scan body): ``factory(graph, env)``.
SubgraphFactory = Callable[[onnx.GraphProto, "FallbackEnv"], Any]


def references_attributes(graph: onnx.GraphProto) -> bool:
    """Whether a node of ``graph`` (recursively) takes an attribute by reference (``ref_attr_name``: a
    function body's), which only the reference evaluator resolves (per call)."""
    for node in graph.node:
        for a in node.attribute:
            if a.ref_attr_name:
                return True
            if any(references_attributes(g) for g in _graphs_of(a)):
                return True
    return False


def _graphs_of(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if a.type == onnx.AttributeProto.GRAPH:
        return [a.g]
    return list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []


def _reference():
    from onnx_prepared.bind import reference

    return reference


class FallbackEnv:
    """What every fallback node of one graph shares: opsets, model-local functions, ``run_params``.

    ``subgraph`` builds the evaluator of a plain subgraph; :func:`onnx_prepared.bind.graph.graph_env`
    passes one that runs the body through its own slot-indexed ExecutionPlan (fast kernels inside
    control flow). Without it, bodies run on the reference evaluator. Model-local functions become
    reference evaluators on first use (most models have none), each seeing the functions it calls.
    Not thread-safe while being built; read-only afterwards.
    """

    def __init__(self, opsets: Mapping[str, int], functions: Mapping[tuple[str, str], onnx.FunctionProto],
                 *, subgraph: SubgraphFactory | None = None):
        self.model_opsets = dict(opsets)  # as the model spells them (bind_kernel's opset lookup)
        self.opsets = {("" if d == "ai.onnx" else d): v for d, v in opsets.items()}
        self._subgraph = subgraph
        self._function_protos = dict(functions)
        self._functions: dict[tuple[str, str], Any] | None = None
        self._run_params: dict[str, Any] | None = None
        #: bind.scopes' memo of the subgraphs' outer-scope names, shared by this graph's nested bodies
        self.outer_names_memo: dict[int, tuple[onnx.GraphProto, frozenset[str]]] = {}

    @property
    def subgraph_factory(self) -> SubgraphFactory | None:
        """What builds a plain subgraph's evaluator (None: bodies run on the reference evaluator)."""
        return self._subgraph

    @property
    def functions(self) -> dict[tuple[str, str], Any]:
        """Reference evaluators of the model-local functions, built on first access."""
        if self._functions is None:
            self._functions = _reference().function_evaluators(self._function_protos)
        return self._functions

    @property
    def function_protos(self) -> dict[tuple[str, str], onnx.FunctionProto]:
        return self._function_protos

    @property
    def run_params(self) -> dict[str, Any]:
        """The ``run_params`` every ``OpRun`` of this graph is built with (subgraphs inherit them)."""
        if self._run_params is None:
            ref = _reference()
            self._run_params = {
                "log": ref.no_log,
                "opsets": self.opsets,
                "verbose": 0,
                "new_ops": dict(ref.PATCHES),
                "existing_functions": dict(self.functions),
                "evaluator_cls": self.make_evaluator,
            }
        return self._run_params

    def make_evaluator(self, proto: Any, opsets=None, functions=None, verbose: int = 0, new_ops=None, **kw: Any):
        """What reference ops build for a body: the subgraph factory's evaluator for a plain subgraph,
        the reference otherwise.

        Function bodies (FunctionProto) and graphs whose nodes reference function attributes stay with
        the reference evaluator, which resolves attribute references per call.
        """
        ref = _reference()
        if self._subgraph is not None and isinstance(proto, onnx.GraphProto) and not references_attributes(proto):
            return self._subgraph(proto, self)
        return ref.Evaluator(proto, opsets=opsets, functions=functions, verbose=verbose, new_ops=new_ops, **kw)

    def load(self, node: onnx.NodeProto, input_types: Sequence[onnx.TypeProto] | None = None) -> Callable:
        """The ``OpRun`` class (or factory) implementing ``node``; RuntimeContextError if it needs types."""
        return _reference().load_op_class(self, node, input_types)


def bind_fallback(node: onnx.NodeProto, opsets: Mapping[str, int],
                  functions: Mapping[tuple[str, str], onnx.FunctionProto], implicit: tuple[str, ...],
                  env: FallbackEnv | None = None) -> Callable[..., tuple]:
    """:func:`onnx_prepared.bind.reference.bind_fallback`, importing ``onnx.reference`` on first use."""
    return _reference().bind_fallback(node, opsets, functions, implicit, env)
