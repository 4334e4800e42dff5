"""If and Loop of our own: their bodies run on ExecutionPlans built once per node, at binding.

Each body becomes the graph's subgraph evaluator (:class:`~onnx_prepared.bind.graph.SubgraphEvaluator`,
reached through the :class:`FallbackEnv`'s subgraph factory, so this module needs nothing from
``graph``); a run only calls its positional runner: no onnx.reference, no per-iteration dicts. The
node's outer-scope values (its ``implicit_inputs``) arrive after the explicit inputs, in the order of
``implicit``, and each body picks the ones it reads.

Semantics follow onnxruntime (and the reference op patches they replace, reference.py):

* If: a single-element condition selects the branch; its outputs are returned as they are (an empty
  optional or a sequence included).
* Loop: ``M`` (trip count) and ``cond`` are optional; the body gets the iteration number (int64, or
  ``M``'s dtype), the current condition and the loop-carried values, and returns the next condition,
  the carried values and its scan outputs, which are stacked along a new axis 0 (``[0, *dims]`` of
  the declared type when no iteration ran). Cancellation is checked once per body evaluation.

Bodies whose nodes take attributes by reference (function bodies) stay on the reference fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind.fallback_env import FallbackEnv, references_attributes

#: default-domain ops this module binds
CONTROL_FLOW = frozenset({"If", "Loop"})


def bind_control_flow(node: onnx.NodeProto, env: FallbackEnv, implicit: tuple[str, ...]) -> Callable | None:
    """The native call of an If/Loop node, ``call(*inputs, *implicit_values) -> tuple``; None when the
    node is not one, or a body must stay with the reference (no subgraph factory, attribute references)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in CONTROL_FLOW or env.subgraph_factory is None:
        return None
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if any(references_attributes(g) for g in graphs.values()):
        return None
    if node.op_type == "If":
        if set(graphs) != {"then_branch", "else_branch"}:
            return None
        return _bind_if(*(_runner(graphs[k], env, implicit) for k in ("then_branch", "else_branch")))
    if set(graphs) != {"body"}:
        return None
    body = graphs["body"]
    n_carried = len(node.input) - 2
    if n_carried < 0 or len(body.input) != n_carried + 2 or len(body.output) < n_carried + 1:
        return None  # malformed: the reference's error names it
    empties = tuple(_empty_scan(o.type) for o in body.output[1 + n_carried:])
    return _bind_loop(_runner(body, env, implicit), len(node.input), n_carried, empties)


def _empty_scan(tp: onnx.TypeProto) -> np.ndarray:
    """A scan output after zero iterations, as onnxruntime gives it: ``[0, *dims]`` of the body output's
    declared type (unknown dims 0; float32 ``[0]`` when the body declares no tensor type)."""
    if not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
        return np.empty((0,), np.float32)
    tt = tp.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 0 for d in tt.shape.dim]
    return np.empty((0, *dims), onnx.tensor_dtype_to_np_dtype(tt.elem_type))


def _runner(graph: onnx.GraphProto, env: FallbackEnv, implicit: tuple[str, ...]
            ) -> Callable[[Sequence, Sequence], list]:
    return env.subgraph_factory(graph, env).runner(implicit)


def _bind_if(then_run: Callable, else_run: Callable) -> Callable[..., tuple]:
    none: tuple = ()

    def if_(cond: Any, *outer: Any) -> tuple:
        if np.size(cond) != 1:
            raise ValueError(f"If expects a single-element condition, got shape {list(np.shape(cond))}")
        run = then_run if np.asarray(cond).reshape(-1)[0] else else_run
        return tuple(run(none, outer))

    return if_


def _bind_loop(body: Callable, n_in: int, n_carried: int, empties: tuple[np.ndarray, ...]) -> Callable[..., tuple]:
    n_scan = len(empties)

    def loop(trip: Any, cond: Any, *args: Any) -> tuple:
        carried, outer = list(args[:n_carried]), args[n_in - 2:]
        limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
        it_dtype = np.int64 if trip is None else np.asarray(trip).dtype
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        cond_value = np.array(True) if cond is None else cond
        scans: list[list] = [[] for _ in range(n_scan)]
        it = 0
        while keep_going and (limit is None or it < limit):
            out = body((np.array(it, dtype=it_dtype), cond_value, *carried), outer)
            cond_value = out[0]
            keep_going = bool(np.asarray(cond_value).reshape(-1)[0])
            carried = out[1:1 + n_carried]
            for k in range(n_scan):
                scans[k].append(out[1 + n_carried + k])
            it += 1
        return (*carried, *(np.stack(s) if s else e.copy() for s, e in zip(scans, empties)))

    return loop
