"""Bind a NodeProto to a callable once, at plan time, so the hot path never reads protobufs.

:func:`bind_node` parses attributes once, chooses the fast kernel when one exists and understands every
attribute the node sets, and otherwise the counted ``onnx.reference`` fallback. Nodes whose subgraphs
read outer-scope values (If, Loop, Scan) list those names as ``implicit_inputs``; the executor passes
them after the explicit inputs, and the fallback hands them to the subgraph's own plan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import onnx
from onnx import helper, numpy_helper

from onnx_prepared.errors import ModelLoadError, UnsupportedOpError
from onnx_prepared.kernels import registry
from onnx_prepared.kernels.fallback import FallbackEnv, bind_fallback


@dataclass(frozen=True, slots=True)
class BoundKernel:
    """A node's kernel with its attributes settled: ``call(*inputs) -> tuple``."""

    call: Callable[..., tuple]
    name: str  # e.g. "ai.onnx::Gemm-13" or "fallback:ai.onnx::Loop-16"
    is_fallback: bool
    implicit_inputs: tuple[str, ...] = ()


def parse_attributes(node: onnx.NodeProto) -> dict:
    """ONNX attributes as Python values; tensors become ndarrays, graphs stay GraphProtos."""
    attrs = {}
    for a in node.attribute:
        if a.ref_attr_name:
            # Attribute reference inside a function body: only the fallback can resolve it.
            raise _NeedsFallback
        v = helper.get_attribute_value(a)
        if a.type == onnx.AttributeProto.TENSOR:
            v = numpy_helper.to_array(v)
        elif a.type == onnx.AttributeProto.STRING:
            v = v.decode("utf-8")
        elif a.type == onnx.AttributeProto.STRINGS:
            v = [s.decode("utf-8") for s in v]
        attrs[a.name] = v
    return attrs


class _NeedsFallback(Exception):
    pass


def subgraph_outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph (recursively) reads from enclosing scopes."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {i.name for i in graph.sparse_initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for a in node.attribute:
            for g in _graphs_of(a):
                used |= subgraph_outer_names(g)
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    return used - defined


def _graphs_of(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if a.type == onnx.AttributeProto.GRAPH:
        return [a.g]
    if a.type == onnx.AttributeProto.GRAPHS:
        return list(a.graphs)
    return []


def implicit_inputs_of(node: onnx.NodeProto) -> tuple[str, ...]:
    names: set[str] = set()
    for a in node.attribute:
        for g in _graphs_of(a):
            names |= subgraph_outer_names(g)
    return tuple(sorted(names))


def bind_node(
    node: onnx.NodeProto,
    opsets: dict[str, int],
    functions: dict[tuple[str, str], onnx.FunctionProto] | None = None,
    *,
    env: FallbackEnv | None = None,
    implicit: tuple[str, ...] | None = None,
) -> BoundKernel:
    """Choose and bind the kernel for ``node`` (fast kernel first, then the reference fallback).

    ``env`` is the graph's shared fallback state (built per call when omitted); ``implicit`` the node's
    outer-scope names when the caller already computed them.
    """
    domain = registry.normalize_domain(node.domain)
    opset = opsets.get(domain, opsets.get("ai.onnx", 0)) if domain == "" else opsets.get(domain, 1)
    if implicit is None:
        implicit = implicit_inputs_of(node)
    spec = None if (functions and (node.domain, node.op_type) in functions) else registry.lookup(
        domain, node.op_type, opset
    )
    if spec is not None and not implicit:
        try:
            attrs = parse_attributes(node)
        except _NeedsFallback:
            attrs = None
        if attrs is not None and (spec.var_kwargs or set(attrs) <= spec.params):
            if spec.wants_n_outputs:
                attrs["n_outputs"] = len(node.output)
            call = functools.partial(spec.fn, **attrs) if attrs else spec.fn
            return BoundKernel(call, spec.name, False)
    try:
        call = bind_fallback(node, opsets, functions or {}, implicit, env)
    except (ModelLoadError, UnsupportedOpError):
        raise  # a broken or unsupported subgraph: its own error names the inner node
    except Exception as e:
        raise UnsupportedOpError(
            f"no kernel for node {node.name!r} op {domain or 'ai.onnx'}::{node.op_type} at opset {opset}: "
            f"{e}. Fast kernels for this op: {registry.available(domain, node.op_type) or 'none'}"
        ) from e
    return BoundKernel(call, f"fallback:{domain or 'ai.onnx'}::{node.op_type}-{opset}", True, implicit)
