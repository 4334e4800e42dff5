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
_TARGETS = ("Conv", "Add", "Mul", "GlobalAveragePool", "Gemm", "Flatten")
_MS = "com.microsoft"
#: float ops between a DequantizeLinear and a QuantizeLinear that onnxruntime leaves float (Relu: its
#: ReluQuantFusion only drops a Relu the QuantizeLinear makes redundant), tabulated as onnx_prepared::QLookup
#: (kernels/qlinear_packed.py), with the attributes they may carry
_LOOKUP = {"Relu": (), "HardSigmoid": ("alpha", "beta")}


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.get_attribute_value(a) for a in node.attribute}


def _size(weights: Mapping, name: str) -> int | None:
    w = weights.get(name)
    if w is None:
        return None
    n = 1
    for d in w.dims:
        n *= int(d)
    return n


def _qdq_params(node: onnx.NodeProto, weights: Mapping, op: str) -> str | None:
    """The 8-bit type of a per-tensor QuantizeLinear/DequantizeLinear (``op``) whose scale (float32) and
    zero point are initializers, else None."""
    if node.op_type != op or node.domain not in _DEFAULT or len(node.input) != 3 or not all(node.input):
        return None
    a = _attrs(node)
    if set(a) - {"axis", "saturate"} or _size(weights, node.input[1]) != 1 or _size(weights, node.input[2]) != 1:
        return None
    if weights[node.input[1]].dtype != "float32":
        return None
    dtype = weights[node.input[2]].dtype
    return dtype if dtype in _Q8 else None


def _weight_dq(node: onnx.NodeProto, weights: Mapping, channels: int, axis: int) -> str | None:
    """The type of a DequantizeLinear of an 8-bit initializer, per tensor or per ``axis`` channel."""
    if node.op_type != "DequantizeLinear" or node.domain not in _DEFAULT or len(node.input) != 3:
        return None
    if not all(n in weights for n in node.input):
        return None
    a = _attrs(node)
    if set(a) - {"axis"} or weights[node.input[1]].dtype != "float32":
        return None
    ns, nz = _size(weights, node.input[1]), _size(weights, node.input[2])
    if ns != nz or ns not in (1, channels) or (ns > 1 and int(a.get("axis", 1)) != axis):
        return None
    dtype = weights[node.input[0]].dtype
    return dtype if dtype in _Q8 and weights[node.input[2]].dtype == dtype else None


def _bias_dq(node: onnx.NodeProto, weights: Mapping) -> str | None:
    """The int32 initializer a bias DequantizeLinear reads (onnxruntime uses it as is), else None."""
    if node.op_type != "DequantizeLinear" or node.domain not in _DEFAULT or not node.input:
        return None
    x = weights.get(node.input[0])
    return node.input[0] if x is not None and x.dtype == "int32" and len(x.dims) == 1 else None


def fuse_qdq(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite ``graph``'s QDQ groups in place as onnxruntime's CPU QDQ transformer does; the count.
    ``index``: the resolver's :class:`GraphIndex` of ``graph``, read for the gating test and rescanned
    after a rewrite."""
    if not (index.has("QuantizeLinear") if index is not None else any(n.op_type == "QuantizeLinear"
                                                                        for n in graph.node)):
        return 0
    n = _fuse_qdq(graph, weights)
    if n and index is not None:
        index.rescan()
    return n


def _fuse_qdq(graph: onnx.GraphProto, weights: Mapping) -> int:
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for name in n.input:
            if name:
                consumers.setdefault(name, []).append(i)
    outputs = {o.name for o in graph.output}
    nodes = graph.node

    def dq_of(name: str) -> onnx.NodeProto | None:
        i = producer.get(name)
        return nodes[i] if i is not None and nodes[i].op_type == "DequantizeLinear" else None

    fused: dict[int, onnx.NodeProto] = {}  # the Q's index (or the float QGemm's) -> the new node
    gone: set[int] = set()  # the targets (and their Qs' absorbed indices) removed
    taken: set[int] = set()
    for idx, node in enumerate(nodes):
        if node.domain not in _DEFAULT or node.op_type not in _TARGETS or len(node.output) != 1:
            continue
        if node.output[0] in outputs:
            continue
        ins = [n for n in node.input if n]
        dqs = [dq_of(n) for n in ins]
        if not ins or any(d is None for d in dqs):
            continue
        users = consumers.get(node.output[0], [])
        q = nodes[users[0]] if len(users) == 1 else None
        qtype = _qdq_params(q, weights, "QuantizeLinear") if q is not None else None
        if qtype is None or users[0] in taken:
            if node.op_type != "Gemm" or any(nodes[u].op_type == "QuantizeLinear" for u in users):
                continue
            q = None
        new = _group(node, dqs, q, qtype, weights)
        if new is None:
            continue
        if q is not None:
            taken.add(users[0])
            fused[users[0]] = new
            gone.add(idx)
        else:
            fused[idx] = new
    for idx, node in enumerate(nodes):  # DequantizeLinear -> Relu|HardSigmoid -> QuantizeLinear: one table
        if idx in taken or idx in fused or _qdq_params(node, weights, "QuantizeLinear") is None:
            continue
        u = producer.get(node.input[0])
        if u is None or u in gone or nodes[u].domain not in _DEFAULT or nodes[u].op_type not in _LOOKUP:
            continue
        f = nodes[u]
        if len(f.input) != 1 or consumers.get(f.output[0]) != [idx] or f.output[0] in outputs:
            continue
        if {a.name for a in f.attribute} - set(_LOOKUP[f.op_type]):
            continue
        d = dq_of(f.input[0])
        if d is None or _qdq_params(d, weights, "DequantizeLinear") is None:
            continue
        new = _node("QLookup", [*d.input, *node.input[1:]], node.output, node.name, "onnx_prepared", f.attribute)
        new.attribute.add(name="function", type=onnx.AttributeProto.STRING, s=f.op_type.encode())
        fused[idx] = new
        gone.add(u)
    if not fused:
        return 0
    for i, n in fused.items():
        nodes[i].CopyFrom(n)
    live = [i for i in range(len(nodes)) if i not in gone]
    read = {name for i in live for name in nodes[i].input}
    dead = {i for i in live if nodes[i].op_type == "DequantizeLinear" and nodes[i].domain in _DEFAULT
            and nodes[i].output[0] not in read and nodes[i].output[0] not in outputs}
    for i in sorted(gone | dead, reverse=True):
        del nodes[i]
    return len(fused)


def _group(node, dqs, q, qtype, weights) -> onnx.NodeProto | None:
    """The node replacing ``node`` with its DequantizeLinears ``dqs`` and QuantizeLinear ``q``, or None."""
    op = node.op_type
    out = [q.output[0]] if q is not None else list(node.output)
    a = _attrs(node)
    if op in ("Add", "Mul"):
        if len(dqs) != 2 or any(_qdq_params(d, weights, "DequantizeLinear") != qtype for d in dqs):
            return None
        ins = [*dqs[0].input, *dqs[1].input, *q.input[1:]]
        return _node(f"QLinear{op}", ins, out, node.name, _MS)
    if op in ("GlobalAveragePool", "Flatten"):
        if len(dqs) != 1 or _qdq_params(dqs[0], weights, "DequantizeLinear") != qtype:
            return None
        if op == "Flatten":
            if list(dqs[0].input[1:]) != list(q.input[1:]):  # the same scale and zero point initializers
                return None
            return _node("Flatten", [dqs[0].input[0]], out, node.name, "", node.attribute)
        return _node("QLinearGlobalAveragePool", [*dqs[0].input, *q.input[1:]], out, node.name, _MS)
    if op == "Conv":
        if len(dqs) not in (2, 3) or qtype != "uint8" or _qdq_params(dqs[0], weights, "DequantizeLinear") != qtype:
            return None
        w = weights.get(dqs[1].input[0]) if dqs[1].input else None
        if w is None or len(w.dims) < 3 or _weight_dq(dqs[1], weights, int(w.dims[0]), 0) is None:
            return None
        bias = _bias_dq(dqs[2], weights) if len(dqs) == 3 else ""
        if bias is None or set(a) - {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}:
            return None
        ins = [*dqs[0].input, *dqs[1].input, *q.input[1:]] + ([bias] if bias else [])
        return _node("QLinearConv", ins, out, node.name, "", node.attribute)
    # Gemm
    if len(dqs) not in (2, 3) or set(a) - {"alpha", "beta", "transA", "transB"}:
        return None
    atype = _qdq_params(dqs[0], weights, "DequantizeLinear")
    b = weights.get(dqs[1].input[0]) if dqs[1].input else None
    if atype is None or b is None or len(b.dims) != 2 or (q is not None and qtype != atype):
        return None
    n = int(b.dims[0] if a.get("transB", 0) else b.dims[1])
    btype = _weight_dq(dqs[1], weights, n, 1 if not a.get("transB", 0) else 0)
    if btype is None or (atype == "int8" and btype != "int8"):
        return None
    bias = ""
    if len(dqs) == 3:
        bias = _bias_dq(dqs[2], weights)
        if bias is None or float(a.get("beta", 1.0)) != 1.0:
            return None
    ins = [*dqs[0].input, *dqs[1].input, bias] + (list(q.input[1:]) if q is not None else [])
    while ins and not ins[-1]:
        ins.pop()
    return _node("QGemm", ins, out, node.name, _MS, [x for x in node.attribute if x.name != "beta"])


def _node(op: str, inputs, outputs, name: str, domain: str, attrs=()) -> onnx.NodeProto:
    """A node with copies of ``attrs`` (AttributeProtos of the node it replaces)."""
    node = onnx.NodeProto(op_type=op, input=list(inputs), output=list(outputs), name=name, domain=domain)
    for a in attrs:
        node.attribute.add().CopyFrom(a)
    return node
