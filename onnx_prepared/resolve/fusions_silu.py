"""The SiLU of a Llama MLP as torch and onnxruntime-genai's builder export it, ``Mul(x, Sigmoid(x))``
(either operand order), and the gate product that usually follows it, ``Mul(silu, u)``, become one
``onnx_prepared::SiLU(x[, u])`` node (kernels/silu.py: the unfused kernels' bits in one pass).

The Sigmoid's output must be read by that Mul alone, and the SiLU's by the gate Mul alone (to take it),
neither returned by the graph. The fused node takes the last node's place in the graph (its inputs are
all written before it). onnxruntime makes the same first step (QuickGeluFusion, alpha 1: its kernel is
the same logistic and product). Graphs with subgraphs are left alone (a body may read an intermediate by
name).
"""

from __future__ import annotations

from collections.abc import Mapping

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.kernels import catalog
from onnx_prepared.resolve.fusions import _rewrite
from onnx_prepared.resolve.graph_index import GraphIndex

_DEFAULT = ("", "ai.onnx")


def fuse_silu(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite ``graph``'s SiLU chains in place; the count of fused nodes. ``weights`` is unused (the
    pattern reads no initializer); ``index``: the resolver's :class:`GraphIndex` of ``graph``."""
    index = index if index is not None else GraphIndex(graph)
    if not index.has("Sigmoid") or index.subgraphs:
        return 0
    consumers, outputs = index.consumers, index.graph_outputs
    ops, domains, ins, outs = index.op_types, index.domains, index.inputs, index.outputs

    def only_mul(name: str) -> int | None:
        """The one default-domain two-input Mul reading ``name`` (once), which the graph does not return."""
        users = consumers.get(name, ())
        if len(users) != 1 or name in outputs:
            return None
        i = users[0]
        if ops[i] != "Mul" or domains[i] not in _DEFAULT or len(ins[i]) != 2 or len(outs[i]) != 1:
            return None
        return i if ins[i][0] != ins[i][1] else None

    replace: dict[int, onnx.NodeProto] = {}
    drop: set[int] = set()
    for si in index.of("Sigmoid"):
        if len(ins[si]) != 1 or len(outs[si]) != 1 or index.attributes(si):
            continue
        x, s = ins[si][0], outs[si][0]
        mi = only_mul(s)
        if mi is None or x not in ins[mi]:
            continue
        chain, last, extra = [si, mi], mi, []
        gi = only_mul(outs[mi][0])
        if gi is not None:
            chain.append(gi)
            last = gi
            a, b = ins[gi]
            extra = [b if a == outs[mi][0] else a]
        if any(i in drop or i in replace for i in chain):
            continue
        replace[last] = onnx.NodeProto(op_type="SiLU", domain="onnx_prepared", name=index.names[si],
                                       input=[x, *extra], output=list(outs[last]))
        drop.update(i for i in chain if i != last)
    if replace:
        catalog.ensure_loaded("onnx_prepared", "SiLU")
    return _rewrite(graph, replace, drop, index)
