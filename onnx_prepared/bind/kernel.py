"""Choose and bind one node's kernel: the fast kernel when it understands the node, else the fallback.

The choice is made once, at resolution (:func:`onnx_prepared.resolve.resolve_model` stores a
:class:`BoundKernel` per node in the frozen ``ResolvedModel``); the plan, the runtime and ``inspect``
read that binding. Nodes whose subgraphs read outer-scope values (If, Loop, Scan) list those names as
``implicit_inputs``; the executor passes them after the explicit inputs. If and Loop run natively
(:mod:`~onnx_prepared.bind.control_flow`); other subgraph ops' fallback hands them to the subgraph's
own plan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.bind.attributes import parse_attributes
from onnx_prepared.bind.control_flow import bind_control_flow
from onnx_prepared.bind.fallback_env import FallbackEnv, bind_fallback
from onnx_prepared.bind.scopes import implicit_inputs_of
from onnx_prepared.errors import ModelLoadError, UnsupportedOpError
from onnx_prepared.kernels import registry
from onnx_prepared.records import record


@record(frozen=True, slots=True)
class BoundKernel:
    """A node's kernel with its attributes settled: ``call(*inputs) -> tuple``."""

    call: Callable[..., tuple]
    name: str  # e.g. "ai.onnx::Gemm-13", "prepacked:<layout>" or "fallback:ai.onnx::Loop-16"
    is_fallback: bool
    implicit_inputs: tuple[str, ...] = ()


def node_opset(node: onnx.NodeProto, opsets: dict[str, int]) -> int:
    """The opset a node's domain is imported at (the default domain may be spelled "ai.onnx")."""
    return domain_opset(registry.normalize_domain(node.domain), opsets)


def domain_opset(domain: str, opsets: dict[str, int]) -> int:
    """The opset a normalized domain is imported at (:func:`node_opset` without the protobuf read)."""
    return opsets.get(domain, opsets.get("ai.onnx", 0)) if domain == "" else opsets.get(domain, 1)


def bind_kernel(
    node: onnx.NodeProto,
    env: FallbackEnv,
    *,
    implicit: tuple[str, ...] | None = None,
    attrs: dict | None = None,
    fields: tuple[str, str, int] | None = None,
) -> BoundKernel:
    """Choose and bind the kernel for ``node`` (fast kernel first, then the reference fallback).

    ``env`` is the graph's shared fallback state; ``implicit`` the node's outer-scope names, ``attrs``
    its parsed attributes and ``fields`` its (domain, op_type, number of outputs) when the caller
    already has them (resolution's index: no protobuf field is read then on the fast-kernel path).
    """
    raw_domain, op_type, n_outputs = fields if fields is not None else (node.domain, node.op_type, None)
    domain = registry.normalize_domain(raw_domain)
    opsets = env.model_opsets
    opset = domain_opset(domain, opsets)
    if implicit is None:
        implicit = implicit_inputs_of(node, env.outer_names_memo)
    functions = env.function_protos
    spec = None if functions and (raw_domain, op_type) in functions else registry.lookup(domain, op_type, opset)
    if spec is not None and not implicit:
        if attrs is None:
            attrs = parse_attributes(node)
        if attrs is not None and (spec.var_kwargs or set(attrs) <= spec.params):
            attrs = dict(attrs)
            if spec.wants_n_outputs:
                attrs["n_outputs"] = len(node.output) if n_outputs is None else n_outputs
            call = functools.partial(spec.fn, **attrs) if attrs else spec.fn
            return BoundKernel(call, spec.name, False)
    if spec is None:
        call = bind_control_flow(node, env, implicit, opset)  # If/Loop/Scan: bodies on their own plans
        if call is not None:
            return BoundKernel(call, f"control:{domain or 'ai.onnx'}::{node.op_type}-{opset}", False, implicit)
    try:
        call = bind_fallback(node, opsets, functions, implicit, env)
    except (ModelLoadError, UnsupportedOpError):
        raise  # a broken or unsupported subgraph: its own error names the inner node
    except Exception as e:
        raise UnsupportedOpError(
            f"no kernel for node {node.name!r} op {domain or 'ai.onnx'}::{node.op_type} at opset {opset}: "
            f"{e}. Fast kernels for this op: {registry.available(domain, node.op_type) or 'none'}"
        ) from e
    return BoundKernel(call, f"fallback:{domain or 'ai.onnx'}::{node.op_type}-{opset}", True, implicit)


def specialize_constants(k: BoundKernel, consts: Mapping[int, object], n_inputs: int) -> BoundKernel:
    """``k`` with its kernel's specialized call for the inputs known at binding (``consts``: input
    position -> value, maybe none; see ``registry.specializes``), or ``k`` itself when there is nothing
    to specialize."""
    if k.is_fallback or k.implicit_inputs:
        return k
    call = k.call
    fn, attrs = (call.func, call.keywords) if isinstance(call, functools.partial) else (call, {})
    specialize = getattr(fn, "specialize", None)
    if specialize is None:
        return k
    special = specialize(consts, n_inputs, **attrs)
    return k if special is None else BoundKernel(special, k.name, k.is_fallback, k.implicit_inputs)
