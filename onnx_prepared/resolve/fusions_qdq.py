"""The QDQ rewrites onnxruntime's CPU QDQ transformer makes (``qdq_selector_action_transformer.cc``), so
a ``QuantFormat.QDQ`` model computes what onnxruntime computes: its integer QLinear kernels, not the
float op between a DequantizeLinear and a QuantizeLinear.

Where every input of a target node comes from a DequantizeLinear and its one consumer is a
QuantizeLinear (its output not a graph output), the group becomes one node reading the quantized
tensors and writing the QuantizeLinear's output, as onnxruntime's selectors decide:

- Conv -> QLinearConv: uint8 activations in and out (int8 activations only where onnxruntime allows
  int8, which depends on its build: left as written), uint8/int8 weights, an optional int32 bias whose
  own DequantizeLinear is dropped (onnxruntime passes the int32 tensor as is, its scale unused);
- Add, Mul -> com.microsoft QLinearAdd, QLinearMul (all three types equal);
- GlobalAveragePool -> com.microsoft QLinearGlobalAveragePool;
- Gemm -> com.microsoft QGemm (beta 1 with an int32 bias; no QuantizeLinear: float32 output);
- Flatten between a DequantizeLinear and a QuantizeLinear of the same scale and zero point (onnxruntime's
  "drop" rule): the Flatten of the quantized tensor;
- a Relu or HardSigmoid between them, which onnxruntime computes in float32, becomes one
  ``onnx_prepared::QLookup``: the chain's output for each of the 256 input values, tabulated once with
  the same kernels (so the same integers as the chain).

onnxruntime first gives every consumer its own DequantizeLinear (EnsureUniqueDQForNodeUnit), so a shared
DequantizeLinear does not block a group here either; it is removed once nothing reads it. Only
per-tensor activation parameters held in initializers are taken (what ``quantize_static`` writes), so
the rewrite needs no payload. Anything else is left as written.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.resolve.graph_index import GraphIndex

_DEFAULT = ("", "ai.onnx")
_Q8 = ("uint8", "int8")
_T = onnx.TensorProto
#: element type -> the 8-bit type's name (an int lookup: a numpy dtype compared with a str parses the str)
_Q8_OF = {_T.UINT8: "uint8", _T.INT8: "int8"}
_FLOAT, _INT32 = _T.FLOAT, _T.INT32
_TARGETS = ("Conv", "Add", "Mul", "GlobalAveragePool", "Gemm", "Flatten")
_MS = "com.microsoft"
#: float ops between a DequantizeLinear and a QuantizeLinear that onnxruntime leaves float (Relu: its
#: ReluQuantFusion only drops a Relu the QuantizeLinear makes redundant), tabulated as onnx_prepared::QLookup
#: (kernels/qlinear_packed.py), with the attributes they may carry
_LOOKUP = {"Relu": (), "HardSigmoid": ("alpha", "beta")}


def _size(weights: Mapping, name: str) -> int | None:
    w = weights.get(name)
    if w is None:
        return None
    n = 1
    for d in w.dims:
        n *= int(d)
    return n


class _View:
    """The index's facts of the graph's nodes, as the selectors read them (op type, domain, inputs,
    outputs, attribute names and values): the protobuf nodes are read only for what a new node copies."""

    __slots__ = ("attributes", "domains", "inputs", "op_types", "outputs")

    def __init__(self, index: GraphIndex) -> None:
        self.op_types, self.domains = index.op_types, index.domains
        self.inputs, self.outputs = index.inputs, index.outputs
        self.attributes = index.attributes

    def is_op(self, i: int, op: str) -> bool:
        return self.op_types[i] == op and self.domains[i] in _DEFAULT


def _qdq_params(v: _View, i: int, weights: Mapping, op: str) -> str | None:
    """The 8-bit type of a per-tensor QuantizeLinear/DequantizeLinear (``op``) node ``i`` whose scale
    (float32) and zero point are initializers, else None."""
    ins = v.inputs[i]
    if not v.is_op(i, op) or len(ins) != 3 or not all(ins):
        return None
    a = v.attributes(i)
    if a is None or not a.keys() <= _QDQ_ATTRS or _size(weights, ins[1]) != 1 or _size(weights, ins[2]) != 1:
        return None
    if weights[ins[1]].elem_type != _FLOAT:
        return None
    return _Q8_OF.get(weights[ins[2]].elem_type)


_QDQ_ATTRS = frozenset({"axis", "saturate"})


def _weight_dq(v: _View, i: int, weights: Mapping, channels: int, axis: int) -> str | None:
    """The type of a DequantizeLinear ``i`` of an 8-bit initializer, per tensor or per ``axis`` channel."""
    ins = v.inputs[i]
    if not v.is_op(i, "DequantizeLinear") or len(ins) != 3:
        return None
    if not all(n in weights for n in ins):
        return None
    a = v.attributes(i)
    if a is None or set(a) - {"axis"} or weights[ins[1]].elem_type != _FLOAT:
        return None
    ns, nz = _size(weights, ins[1]), _size(weights, ins[2])
    if ns != nz or ns not in (1, channels) or (ns > 1 and int(a.get("axis", 1)) != axis):
        return None
    t = weights[ins[0]].elem_type
    return _Q8_OF.get(t) if weights[ins[2]].elem_type == t else None


def _bias_dq(v: _View, i: int, weights: Mapping) -> str | None:
    """The int32 initializer a bias DequantizeLinear ``i`` reads (onnxruntime uses it as is), else None."""
    ins = v.inputs[i]
    if not v.is_op(i, "DequantizeLinear") or not ins:
        return None
    x = weights.get(ins[0])
    return ins[0] if x is not None and x.elem_type == _INT32 and len(x.dims) == 1 else None


def fuse_qdq(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite ``graph``'s QDQ groups in place as onnxruntime's CPU QDQ transformer does; the count.
    ``index``: the resolver's :class:`GraphIndex` of ``graph`` (one is built when None): the selectors
    read its lists and maps, and a rewrite updates it from the nodes written."""
    index = index if index is not None else GraphIndex(graph)
    if not index.has("QuantizeLinear"):
        return 0
    return _fuse_qdq(graph, weights, index)


def _fuse_qdq(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex) -> int:
    v = _View(index)
    producer, consumers, outputs = index.producer, index.consumers, index.graph_outputs
    op_types, domains, inputs_of, outputs_of = v.op_types, v.domains, v.inputs, v.outputs
    nodes = graph.node

    def dq_of(name: str) -> int | None:
        i = producer.get(name)
        return i if i is not None and op_types[i] == "DequantizeLinear" else None

    fused: dict[int, onnx.NodeProto] = {}  # the Q's index (or the float QGemm's) -> the new node
    gone: set[int] = set()  # the targets (and their Qs' absorbed indices) removed
    taken: set[int] = set()
    for idx, op in enumerate(op_types):
        if op not in _TARGETS or domains[idx] not in _DEFAULT or len(outputs_of[idx]) != 1:
            continue
        out = outputs_of[idx][0]
        if out in outputs:
            continue
        ins = [n for n in inputs_of[idx] if n]
        dqs = [dq_of(n) for n in ins]
        if not ins or None in dqs:
            continue
        users = consumers.get(out, [])
        q = users[0] if len(users) == 1 else None
        qtype = _qdq_params(v, q, weights, "QuantizeLinear") if q is not None else None
        if qtype is None or q in taken:
            if op != "Gemm" or any(op_types[u] == "QuantizeLinear" for u in users):
                continue
            q = None
        new = _group(v, nodes, idx, dqs, q, qtype, weights)
        if new is None:
            continue
        if q is not None:
            taken.add(q)
            fused[q] = new
            gone.add(idx)
        else:
            fused[idx] = new
    for idx, op in enumerate(op_types):  # DequantizeLinear -> Relu|HardSigmoid -> QuantizeLinear: one table
        if op != "QuantizeLinear" or idx in taken or idx in fused:
            continue
        if _qdq_params(v, idx, weights, "QuantizeLinear") is None:
            continue
        u = producer.get(inputs_of[idx][0])
        if u is None or u in gone or domains[u] not in _DEFAULT or op_types[u] not in _LOOKUP:
            continue
        f_in, f_out = inputs_of[u], outputs_of[u]
        if len(f_in) != 1 or consumers.get(f_out[0]) != [idx] or f_out[0] in outputs:
            continue
        f_attrs = v.attributes(u)
        if f_attrs is None or set(f_attrs) - set(_LOOKUP[op_types[u]]):
            continue
        d = dq_of(f_in[0])
        if d is None or _qdq_params(v, d, weights, "DequantizeLinear") is None:
            continue
        new = _node("QLookup", [*inputs_of[d], *inputs_of[idx][1:]], outputs_of[idx], index.names[idx],
                    "onnx_prepared", nodes[u].attribute)
        new.attribute.add(name="function", type=onnx.AttributeProto.STRING, s=op_types[u].encode())
        fused[idx] = new
        gone.add(u)
    if not fused:
        return 0
    fused_ins = {i: tuple(n.input) for i, n in fused.items()}
    live = [i for i in range(len(op_types)) if i not in gone]
    read = {name for i in live for name in fused_ins.get(i, inputs_of[i])}
    dead = {i for i in live if i not in fused and op_types[i] == "DequantizeLinear" and domains[i] in _DEFAULT
            and outputs_of[i][0] not in read and outputs_of[i][0] not in outputs}
    for i, n in fused.items():
        nodes[i].CopyFrom(n)
    drop = gone | dead
    for i in sorted(drop, reverse=True):
        del nodes[i]
    index.rewritten(fused, drop)
    return len(fused)


def _group(v: _View, nodes, idx: int, dqs: list[int], q: int | None, qtype, weights) -> onnx.NodeProto | None:
    """The node replacing node ``idx`` with its DequantizeLinears ``dqs`` and QuantizeLinear ``q`` (node
    indices), or None."""
    op = v.op_types[idx]
    ins_of = v.inputs
    out = [v.outputs[q][0]] if q is not None else list(v.outputs[idx])
    q_params = list(ins_of[q][1:]) if q is not None else []
    a = v.attributes(idx)
    if a is None:
        return None
    if op in ("Add", "Mul"):
        if len(dqs) != 2 or any(_qdq_params(v, d, weights, "DequantizeLinear") != qtype for d in dqs):
            return None
        return _node(f"QLinear{op}", [*ins_of[dqs[0]], *ins_of[dqs[1]], *q_params], out, nodes[idx].name, _MS)
    if op in ("GlobalAveragePool", "Flatten"):
        if len(dqs) != 1 or _qdq_params(v, dqs[0], weights, "DequantizeLinear") != qtype:
            return None
        d_ins = ins_of[dqs[0]]
        if op == "Flatten":
            if list(d_ins[1:]) != q_params:  # the same scale and zero point initializers
                return None
            return _node("Flatten", [d_ins[0]], out, nodes[idx].name, "", nodes[idx].attribute)
        return _node("QLinearGlobalAveragePool", [*d_ins, *q_params], out, nodes[idx].name, _MS)
    if op == "Conv":
        if len(dqs) not in (2, 3) or qtype != "uint8" or _qdq_params(v, dqs[0], weights, "DequantizeLinear") != qtype:
            return None
        w_ins = ins_of[dqs[1]]
        w = weights.get(w_ins[0]) if w_ins else None
        if w is None or len(w.dims) < 3 or _weight_dq(v, dqs[1], weights, int(w.dims[0]), 0) is None:
            return None
        bias = _bias_dq(v, dqs[2], weights) if len(dqs) == 3 else ""
        if bias is None or set(a) - {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}:
            return None
        ins = [*ins_of[dqs[0]], *w_ins, *q_params] + ([bias] if bias else [])
        return _node("QLinearConv", ins, out, nodes[idx].name, "", nodes[idx].attribute)
    # Gemm
    if len(dqs) not in (2, 3) or set(a) - {"alpha", "beta", "transA", "transB"}:
        return None
    atype = _qdq_params(v, dqs[0], weights, "DequantizeLinear")
    b_ins = ins_of[dqs[1]]
    b = weights.get(b_ins[0]) if b_ins else None
    if atype is None or b is None or len(b.dims) != 2 or (q is not None and qtype != atype):
        return None
    n = int(b.dims[0] if a.get("transB", 0) else b.dims[1])
    btype = _weight_dq(v, dqs[1], weights, n, 1 if not a.get("transB", 0) else 0)
    if btype is None or (atype == "int8" and btype != "int8"):
        return None
    bias = ""
    if len(dqs) == 3:
        bias = _bias_dq(v, dqs[2], weights)
        if bias is None or float(a.get("beta", 1.0)) != 1.0:
            return None
    ins = [*ins_of[dqs[0]], *b_ins, bias] + q_params
    while ins and not ins[-1]:
        ins.pop()
    return _node("QGemm", ins, out, nodes[idx].name, _MS, [x for x in nodes[idx].attribute if x.name != "beta"])


def _node(op: str, inputs, outputs, name: str, domain: str, attrs=()) -> onnx.NodeProto:
    """A node with copies of ``attrs`` (AttributeProtos of the node it replaces)."""
    node = onnx.NodeProto(op_type=op, input=list(inputs), output=list(outputs), name=name, domain=domain)
    for a in attrs:
        node.attribute.add().CopyFrom(a)
    return node
