"""The one fallback path: run an op through ``onnx.reference``'s implementation.

Every standard op without a fast kernel (control flow included) runs here, so coverage is the whole
standard op set. The path is named and counted (:data:`FALLBACK_CALLS`), never silent.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

#: op name -> number of fallback invocations in this process (diagnostics, `inspect`).
FALLBACK_CALLS: collections.Counter[str] = collections.Counter()


def bind_fallback(
    node: onnx.NodeProto,
    opsets: dict[str, int],
    functions: dict[tuple[str, str], onnx.FunctionProto],
    implicit: tuple[str, ...],
) -> Callable[..., tuple]:
    """A callable ``(*inputs, *implicit_values) -> tuple`` evaluating ``node`` with onnx.reference."""
    n_in = len(node.input)
    in_names = [f"__in{i}" if name else "" for i, name in enumerate(node.input)]
    out_names = [f"__out{i}" if name else "" for i, name in enumerate(node.output)]
    inner = helper.make_node(node.op_type, in_names, out_names, domain=node.domain, name=node.name)
    inner.attribute.extend(node.attribute)
    opset_imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    fn = helper.make_function(
        "onnx_prepared.fallback",
        "single_node",
        [n for n in in_names if n] + list(implicit),
        [n for n in out_names if n],
        [inner],
        opset_imports,
    )
    ev = ReferenceEvaluator(fn, functions=list(functions.values()) or None)
    feed_names = [n for n in in_names if n] + list(implicit)
    key = f"{node.domain or 'ai.onnx'}::{node.op_type}"

    def call(*args):
        FALLBACK_CALLS[key] += 1
        explicit = [a for i, a in enumerate(args[:n_in]) if in_names[i]]
        feeds = dict(zip(feed_names, explicit + list(args[n_in:])))
        res = ev.run(None, feeds, attributes={})
        return tuple(res)

    return call
