"""Graph rewrites applied to the resolver's copy of the graph before kernels are chosen.

- the one onnxruntime performs for weight-only INT4 QDQ models: a blocked INT4 ``DequantizeLinear`` of
  initializers whose only consumers are MatMuls reading it as B becomes, per MatMul, one
  ``onnx_prepared::DequantizeMatMul`` node (kernels/dq_matmul.py), which the prepack rule binds to the
  native MatMulNBits path;
- an Identity of an initializer (torch.onnx.export writes one per shared weight) is dropped and its
  readers read the initializer, so the rewrites below see constant weights;
- a squeeze-and-excitation block ``Mul(X, HardSigmoid|Sigmoid(Conv(Relu(Conv(GlobalAveragePool(X))))))``
  with 1x1 constant-weight Convs becomes one ``onnx_prepared::SqueezeExcite`` (kernels/squeeze_excite.py);
- a float32 Conv with a constant weight whose only consumer is an inference-mode BatchNormalization of
  constant statistics becomes one ``onnx_prepared::FusedConv`` carrying the BatchNormalization's inputs
  (folded into the weight and bias at prepack time, as onnxruntime's ConvBNFusion does);
- a float32 Conv (or such a FusedConv) with a constant weight whose only consumer is an Add of another
  tensor (a residual connection), with that Add's Relu or Clip, becomes one FusedConv reading the
  residual (:func:`fuse_conv_add`);
- a float32 Conv (or such a FusedConv) with a constant weight whose only consumer is a Relu, a
  HardSwish, a LeakyRelu or a Clip of constant bounds becomes one ``onnx_prepared::FusedConv``
  (kernels/conv_fused.py): the activation runs in the conv kernel's epilogue;
- a transformer encoder's chains (:func:`fuse_encoder`): ``quantize_dynamic``'s DynamicQuantizeLinear +
  MatMulInteger + Cast + scale Muls (+ bias Add) becomes one ``onnx_prepared::DynamicQuantizeMatMul``,
  MatMul + bias Add one ``onnx_prepared::MatMulBias``, the Erf GELU one ``onnx_prepared::GeluErf``, and
  Add + LayerNormalization one ``onnx_prepared::AddLayerNormalization``: on a small encoder the
  per-node cost, not the arithmetic, is the run time.

Anything that does not match exactly is left as written.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.kernels import catalog
from onnx_prepared.resolve.graph_index import GraphIndex

_INT4 = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)


def fuse_dequantize_matmul(graph: onnx.GraphProto, weights: Mapping, opsets: Mapping[str, int],
                           index: GraphIndex | None = None) -> int:
    """Rewrite every matching DequantizeLinear + MatMul pair in ``graph`` in place; returns how many
    MatMuls were fused. ``index``: the resolver's shared :class:`GraphIndex` of ``graph`` (kept true)."""
    if opsets.get("", opsets.get("ai.onnx", 0)) < 21:  # block_size exists from DequantizeLinear-21
        return 0
    index = index if index is not None else GraphIndex(graph)
    if not index.has("DequantizeLinear"):  # the usual case: no consumer map
        return 0
    consumers: dict[str, list[int]] = {}
    for idx, node in enumerate(graph.node):
        for name in set(node.input):
            consumers.setdefault(name, []).append(idx)
    outputs = {o.name for o in graph.output}
    replace: dict[int, onnx.NodeProto] = {}
    drop: set[int] = set()
    for idx, node in enumerate(graph.node):
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        operands = _blocked_int4(node, weights)
        if operands is None:
            continue
        users = consumers.get(node.output[0], [])
        if not users or not all(_reads_as_b(graph.node[u], node.output[0]) for u in users):
            continue
        dq = _dq_matmul()
        for u in users:
            mm = graph.node[u]
            fused = onnx.NodeProto(op_type=dq.FUSED_OP, input=[mm.input[0], *operands[0]], output=list(mm.output),
                                   name=mm.name, domain=dq.FUSED_DOMAIN)
            fused.attribute.add(name="block_size", type=onnx.AttributeProto.INT, i=int(operands[1]))
            replace[u] = fused
        drop.add(idx)
    return _rewrite(graph, replace, drop, index)


_MODULES: dict[str, object] = {}  # the fused kernels' modules, once imported (asked per fusion)


def _dq_matmul():
    """The fused kernel's module, imported only when a model has a DequantizeLinear to fuse (the kernel
    catalog's rule: kernel modules load when a model uses them)."""
    m = _MODULES.get("dq_matmul")
    if m is None:
        catalog.ensure_loaded("onnx_prepared", "DequantizeMatMul")
        from onnx_prepared.kernels import dq_matmul as m

        _MODULES["dq_matmul"] = m
    return m


def _rewrite(graph, replace: dict[int, onnx.NodeProto], drop: set[int], index: GraphIndex | None = None) -> int:
    """Put each fusion's nodes in place of ``replace``'s indices, remove ``drop``'s (and tell ``index``);
    the count of fusions."""
    if replace:  # in place: copying every node back into the repeated field cost ~1 ms per 150 nodes
        for i, n in replace.items():
            graph.node[i].CopyFrom(n)
        for i in sorted(drop, reverse=True):
            del graph.node[i]
        if index is not None:
            index.rewritten(replace, drop)
    return len(replace)


def _blocked_int4(node: onnx.NodeProto, weights: Mapping) -> tuple[list[str], int] | None:
    """(operand names, block size) when ``node`` dequantizes 2-D int4/uint4 initializers along axis 0
    in blocks the native kernel takes, to float32; else None."""
    attrs = {a.name: onnx.get_attribute_value(a) for a in node.attribute}
    if set(attrs) - {"axis", "block_size", "output_dtype"}:
        return None
    bs = int(attrs.get("block_size", 0))
    if bs not in _dq_matmul().BLOCK_SIZES or int(attrs.get("axis", 1)) not in (0, -2):
        return None
    if int(attrs.get("output_dtype", 0)) not in (0, onnx.TensorProto.FLOAT):
        return None
    names = [n for n in node.input]
    if len(names) == 3 and not names[2]:
        names = names[:2]
    if len(names) not in (2, 3) or not all(n in weights for n in names):
        return None
    x, scale = weights[names[0]], weights[names[1]]
    if x.elem_type not in _INT4 or len(x.dims) != 2 or scale.elem_type != onnx.TensorProto.FLOAT:
        return None
    K, N = x.dims
    if K <= 0 or N <= 0 or tuple(scale.dims) != (-(-K // bs), N):
        return None
    if len(names) == 3:
        zp = weights[names[2]]
        if zp.elem_type != x.elem_type or tuple(zp.dims) != tuple(scale.dims):
            return None
    return names, bs


def _reads_as_b(node: onnx.NodeProto, name: str) -> bool:
    return (node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) == 2
            and node.input[1] == name and node.input[0] != name)


#: activations fused into a Conv's epilogue: op -> (lo, hi, act) of kernels/conv_fused.py (LeakyRelu's
#: slope and Clip's bounds come from the node: :func:`_conv_epilogue`)
_CONV_EPILOGUES = {"Relu": (0.0, float("inf"), 0), "HardSwish": (float("-inf"), float("inf"), 1),
                   "LeakyRelu": (float("-inf"), float("inf"), 2), "Clip": (float("-inf"), float("inf"), 0)}
#: Clip-6's default bounds (float32 lowest/max): no bound
_FLT_MAX = float(np.finfo(np.float32).max)


def _conv_epilogue(op_type: str, attrs: dict | None, ins: tuple[str, ...], scalars: Mapping[str, float]
                   ) -> tuple[float, float, int, float] | None:
    """``(lo, hi, act code, alpha)`` of the epilogue computing the activation ``op_type`` (one of
    :data:`_CONV_EPILOGUES`) of attributes ``attrs`` (the index's; None: references) and inputs ``ins``, or
    None when it has attributes or inputs the epilogue cannot express: a Clip's bounds must be attributes
    (opset 6-10) or float32 scalar Constant nodes (``scalars``; initializers are not read at resolution)."""
    if attrs is None:
        return None
    lo, hi, code = _CONV_EPILOGUES[op_type]
    if op_type == "LeakyRelu":
        if set(attrs) - {"alpha"}:
            return None
        return lo, hi, code, _f32(attrs.get("alpha", 0.01))
    if op_type == "Clip":
        if set(attrs) - {"min", "max"}:
            return None
        if attrs:  # Clip-6: bounds as attributes
            if len(ins) != 1:
                return None
            mn, mx = _f32(attrs.get("min", -_FLT_MAX)), _f32(attrs.get("max", _FLT_MAX))
            lo, hi = (mn if mn > -_FLT_MAX else lo), (mx if mx < _FLT_MAX else hi)
        else:
            bounds = ins[1:]
            if any(n and n not in scalars for n in bounds):
                return None
            if len(bounds) > 0 and bounds[0]:
                lo = scalars[bounds[0]]
            if len(bounds) > 1 and bounds[1]:
                hi = scalars[bounds[1]]
        return (lo, hi, code, 0.0) if lo <= hi else None  # lo > hi: every value is hi (not a clip of [lo, hi])
    return (lo, hi, code, 0.0) if not attrs else None


def _f32(v: float) -> float:
    """``v`` rounded to float32, as a FLOAT attribute holds it (and parse_attributes reads it back)."""
    return float(np.float32(v))


_CONV_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
_FLOAT = onnx.TensorProto.FLOAT


def _foldable_conv(index: GraphIndex, idx: int, weights: Mapping, *, fused_ok: bool) -> dict | None:
    """Node ``idx``'s attributes when it is a Conv (float32 initializer weight, Conv's own attributes only,
    output not a graph output), or with ``fused_ok`` a FusedConv that has no activation yet; else None.
    Read from the index alone (no protobuf field)."""
    key = index.keys[idx]
    if key == "Conv":
        attrs = index.attributes(idx)
        if attrs is None or not _CONV_ATTRS.issuperset(attrs):
            return None
    elif fused_ok and key == "onnx_prepared:FusedConv":
        attrs = index.attributes(idx)
        if attrs is None or any(k.startswith("activation_") for k in attrs):
            return None
    else:
        return None
    outs = index.outputs[idx]
    if len(outs) != 1 or outs[0] in index.graph_outputs:
        return None
    ins = index.inputs[idx]
    if len(ins) < 2 or len(ins) > RESIDUAL_INPUT:  # (a FusedConv reading a residual has its epilogue)
        return None
    w = weights.get(ins[1])
    return attrs if w is not None and w.elem_type == _FLOAT else None


#: BatchNormalization attributes the fold understands (training_mode and spatial only at their defaults)
_BN_ATTRS = frozenset({"epsilon", "momentum", "spatial", "is_test", "consumed_inputs", "training_mode"})


def _inference_bn(index: GraphIndex, i: int, weights: Mapping, channels: int) -> float | None:
    """The epsilon of node ``i`` when it is an inference-mode BatchNormalization with float32 [channels]
    initializer statistics and one output; None for anything else."""
    ins, outs = index.inputs[i], index.outputs[i]
    if index.keys[i] != "BatchNormalization" or len(ins) != 5:
        return None
    if len(outs) < 1 or any(outs[1:]):
        return None
    attrs = index.attributes(i)
    if (attrs is None or not _BN_ATTRS.issuperset(attrs) or int(attrs.get("training_mode", 0))
            or int(attrs.get("spatial", 1)) != 1):
        return None
    for name in ins[1:]:
        w = weights.get(name)
        if w is None or w.elem_type != _FLOAT or tuple(w.dims) != (channels,):
            return None
    return float(attrs.get("epsilon", 1e-5))


def fuse_conv_batchnorm(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite every Conv whose output feeds exactly one inference-mode BatchNormalization (and nothing
    else) into one FusedConv ``(X, W, B or '', scale, bn_B, mean, var)`` with ``bn_epsilon``, writing the
    BatchNormalization's output; returns how many were fused. Run before :func:`fuse_conv_activation`.
    The Conv node becomes the FusedConv in place, and the index gets its fields and attributes as
    written (no new node is built, copied and read back: that was ~20 us a fusion)."""
    index = index if index is not None else GraphIndex(graph)
    if not index.has("BatchNormalization"):
        return 0
    consumers = index.consumers
    fused: dict[int, tuple] = {}
    drop: set[int] = set()
    for idx in index.of("Conv"):
        attrs = _foldable_conv(index, idx, weights, fused_ok=False)
        if attrs is None:
            continue
        ins = index.inputs[idx]
        w = weights[ins[1]]
        if len(w.dims) < 3 or (len(ins) > 2 and ins[2] and ins[2] not in weights):
            continue
        users = consumers.get(index.outputs[idx][0], [])
        if len(users) != 1 or users[0] in drop:
            continue
        bn = users[0]
        eps = _inference_bn(index, bn, weights, int(w.dims[0]))
        if eps is None:
            continue
        new_ins = (*ins[:2], ins[2] if len(ins) > 2 else "", *index.inputs[bn][1:])
        out = index.outputs[bn][0]
        cf = _conv_fused()  # (the kernel module loads only when a model has a Conv to fuse)
        node = graph.node[idx]
        node.op_type, node.domain = cf.FUSED_OP, cf.FUSED_DOMAIN
        del node.input[:]
        node.input.extend(new_ins)
        node.output[0] = out
        node.attribute.add(name="bn_epsilon", type=onnx.AttributeProto.FLOAT, f=eps)
        fused[idx] = (cf.FUSED_OP, cf.FUSED_DOMAIN, new_ins, (out,), {**attrs, "bn_epsilon": _f32(eps)})
        drop.add(bn)
    return _fused(graph, fused, drop, index)


def fuse_conv_activation(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite every Conv (float32 initializer weight, Conv's own attributes only) or activation-free
    FusedConv whose output feeds exactly one Relu, HardSwish, LeakyRelu or Clip of constant bounds and
    nothing else (not a graph output) into one FusedConv writing the activation's output; returns how
    many were fused. In place, as :func:`fuse_conv_batchnorm`."""
    index = index if index is not None else GraphIndex(graph)
    if not index.has(*_CONV_EPILOGUES):
        return 0
    scalars = _constant_scalars(graph, index) if index.has("Clip") else {}
    fused: dict[int, tuple] = {}
    drop: set[int] = set()
    for idx, attrs, out, u in _single_reader_convs(index, weights, fused, drop):
        op, act_ins, act_outs = index.keys[u], index.inputs[u], index.outputs[u]
        if op not in _CONV_EPILOGUES or len(act_outs) != 1:  # (a key is the bare op type in the default domain)
            continue
        if act_ins[0] != out:  # a Clip bound computed by the Conv
            continue
        ep = _conv_epilogue(op, index.attributes(u), act_ins, scalars)
        if ep is None:
            continue
        lo, hi, code, alpha = ep
        cf = _conv_fused()
        node = graph.node[idx]
        node.op_type, node.domain = cf.FUSED_OP, cf.FUSED_DOMAIN
        node.output[0] = act_outs[0]
        add = node.attribute.add
        add(name="activation_lo", type=onnx.AttributeProto.FLOAT, f=lo)
        add(name="activation_hi", type=onnx.AttributeProto.FLOAT, f=hi)
        add(name="activation_act", type=onnx.AttributeProto.INT, i=code)
        new_attrs = {**attrs, "activation_lo": _f32(lo), "activation_hi": _f32(hi), "activation_act": code}
        if code == 2:
            add(name="activation_alpha", type=onnx.AttributeProto.FLOAT, f=alpha)
            new_attrs["activation_alpha"] = _f32(alpha)
        fused[idx] = (cf.FUSED_OP, cf.FUSED_DOMAIN, index.inputs[idx], act_outs, new_attrs)
        drop.add(u)
    return _fused(graph, fused, drop, index)


def _single_reader_convs(index: GraphIndex, weights: Mapping, fused: dict, drop: set):
    """(index, attributes, output, its one reader) of each foldable Conv or activation-free FusedConv
    (:func:`_foldable_conv`) whose output one node alone reads, while a pass fills ``fused`` and ``drop``:
    neither the Conv nor its reader already dropped, nor the reader already fused by the pass."""
    consumers = index.consumers
    for idx in index.of("Conv", "onnx_prepared:FusedConv"):
        if idx in drop:
            continue
        attrs = _foldable_conv(index, idx, weights, fused_ok=True)
        if attrs is None:
            continue
        out = index.outputs[idx][0]
        users = consumers.get(out, [])
        if len(users) == 1 and users[0] not in drop and users[0] not in fused:
            yield idx, attrs, out, users[0]


#: activations after a residual Add that the fused epilogue computes: a clip (Relu, Clip), nothing else
_RESIDUAL_EPILOGUES = ("Relu", "Clip")
#: the residual's input position in a FusedConv (after X, W, B and the four BatchNormalization inputs)
RESIDUAL_INPUT = 7


def fuse_conv_add(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite every Conv (float32 initializer weight, Conv's own attributes only) or activation-free
    FusedConv whose output feeds exactly one ``Add(conv, R)`` (either order, R another tensor), and that
    Add's output, when its only reader is a Relu or a Clip of constant bounds, into one FusedConv reading R
    at input 7 (a ResNet block's residual connection): the epilogue adds R after the bias and clips the
    sum, so the kernel writes the block's output once instead of three times. The fused node takes the
    Add's place in the graph (R may be computed after the Conv), the Conv's name and attributes; returns
    how many were fused. Run after :func:`fuse_conv_batchnorm`, before :func:`fuse_conv_activation`."""
    index = index if index is not None else GraphIndex(graph)
    if not index.has("Add"):
        return 0
    scalars = _constant_scalars(graph, index) if index.has("Clip") else {}
    consumers = index.consumers
    fused: dict[int, tuple] = {}
    drop: set[int] = set()
    for idx, attrs, out, u in _single_reader_convs(index, weights, fused, drop):
        ins_u, outs_u = index.inputs[u], index.outputs[u]
        if index.keys[u] != "Add" or len(ins_u) != 2 or len(outs_u) != 1 or ins_u[0] == ins_u[1]:
            continue
        res = ins_u[1] if ins_u[0] == out else ins_u[0]
        if not res:
            continue
        lo, hi, final = float("-inf"), float("inf"), outs_u[0]
        readers = consumers.get(final, [])
        if len(readers) == 1 and final not in index.graph_outputs and readers[0] not in drop:
            a = readers[0]
            if index.keys[a] in _RESIDUAL_EPILOGUES and len(index.outputs[a]) == 1 and index.inputs[a][0] == final:
                ep = _conv_epilogue(index.keys[a], index.attributes(a), index.inputs[a], scalars)
                if ep is not None and ep[2] == 0:
                    lo, hi = ep[0], ep[1]
                    final = index.outputs[a][0]
                    drop.add(a)
        cins = index.inputs[idx]
        new_ins = (*cins, *("",) * (RESIDUAL_INPUT - len(cins)), res)
        cf = _conv_fused()
        node = graph.node[u]
        node.CopyFrom(graph.node[idx])
        node.op_type, node.domain = cf.FUSED_OP, cf.FUSED_DOMAIN
        del node.input[:]
        node.input.extend(new_ins)
        node.output[0] = final
        new_attrs = dict(attrs)
        if lo != float("-inf") or hi != float("inf"):
            node.attribute.add(name="activation_lo", type=onnx.AttributeProto.FLOAT, f=lo)
            node.attribute.add(name="activation_hi", type=onnx.AttributeProto.FLOAT, f=hi)
            node.attribute.add(name="activation_act", type=onnx.AttributeProto.INT, i=0)
            new_attrs.update(activation_lo=_f32(lo), activation_hi=_f32(hi), activation_act=0)
        index.names[u] = index.names[idx]
        fused[u] = (cf.FUSED_OP, cf.FUSED_DOMAIN, new_ins, (final,), new_attrs)
        drop.add(idx)
    return _fused(graph, fused, drop, index)


def _fused(graph, fused: dict[int, tuple], drop: set[int], index: GraphIndex) -> int:
    """Remove ``drop``'s nodes after a pass rewrote the ``fused`` nodes in place (index -> (op_type,
    domain, inputs, outputs, attributes) as written) and tell ``index``; the count of fusions."""
    if fused:
        for i in sorted(drop, reverse=True):
            del graph.node[i]
        index.fused(fused, drop)
    return len(fused)


def _conv_fused():
    """kernels/conv_fused.py, imported only when a model has a Conv to fuse (as _dq_matmul)."""
    m = _MODULES.get("conv_fused")
    if m is None:
        catalog.ensure_loaded("onnx_prepared", "FusedConv")
        from onnx_prepared.kernels import conv_fused as m

        _MODULES["conv_fused"] = m
    return m


def _pointwise_conv(node: onnx.NodeProto, weights: Mapping) -> bool:
    """A 1x1 Conv of a float32 initializer weight (and bias), group 1, no pads, strides or dilations."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return False
    if len(node.input) < 2 or any(n and n not in weights for n in node.input[1:]):
        return False
    w = weights[node.input[1]]
    if w.dtype != "float32" or len(w.dims) < 3 or any(d != 1 for d in w.dims[2:]):
        return False
    for a in node.attribute:
        v = onnx.get_attribute_value(a)
        if a.name in ("pads",) and any(v):
            return False
        if a.name in ("strides", "dilations", "kernel_shape") and any(int(i) != 1 for i in v):
            return False
        if a.name == "group" and int(v) != 1:
            return False
        if a.name == "auto_pad" and v not in (b"NOTSET", b"VALID", b"SAME_UPPER", b"SAME_LOWER"):
            return False
        if a.name not in _CONV_ATTRS:
            return False
    return True


def fuse_squeeze_excite(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Rewrite every ``Mul(X, gate(Conv2(Relu(Conv1(GlobalAveragePool(X))))))`` (1x1 Convs, each
    intermediate read once and no graph output, gate a HardSigmoid or Sigmoid) into one SqueezeExcite
    at the Mul's place; returns how many were fused. Run before the Conv fusions."""
    index = index if index is not None else GraphIndex(graph)
    if not index.has("GlobalAveragePool"):
        return 0
    consumers = index.consumers
    producer = index.producer
    outputs = index.graph_outputs
    replace: dict[int, onnx.NodeProto] = {}
    drop: set[int] = set()

    def single(name: str, op: str) -> int | None:
        """The node producing ``name`` when it is an ``op`` of the default domain whose output only one
        node reads and the graph does not return."""
        i = producer.get(name)
        if i is None or i in drop or name in outputs or len(consumers.get(name, [])) != 1:
            return None
        n = graph.node[i]
        return i if n.op_type == op and n.domain in ("", "ai.onnx") else None

    for idx in index.of("Mul"):
        mul = graph.node[idx]
        if len(mul.input) != 2:
            continue
        for side in (0, 1):
            x, gate_out = mul.input[1 - side], mul.input[side]
            gi = producer.get(gate_out)
            if gi is None or graph.node[gi].op_type not in ("HardSigmoid", "Sigmoid"):
                continue
            gi = single(gate_out, graph.node[gi].op_type)
            c2 = single(graph.node[gi].input[0], "Conv") if gi is not None else None
            r = single(graph.node[c2].input[0], "Relu") if c2 is not None else None
            c1 = single(graph.node[r].input[0], "Conv") if r is not None else None
            p = single(graph.node[c1].input[0], "GlobalAveragePool") if c1 is not None else None
            if p is None or graph.node[p].input[0] != x:
                continue
            conv1, conv2, gate = graph.node[c1], graph.node[c2], graph.node[gi]
            if not (_pointwise_conv(conv1, weights) and _pointwise_conv(conv2, weights)):
                continue
            cr, c = weights[conv1.input[1]].dims[:2]
            if tuple(weights[conv2.input[1]].dims[:2]) != (c, cr):
                continue
            se = onnx.NodeProto(op_type="SqueezeExcite", domain="onnx_prepared", name=mul.name,
                                input=[x, conv1.input[1], conv1.input[2] if len(conv1.input) > 2 else "",
                                       conv2.input[1], conv2.input[2] if len(conv2.input) > 2 else ""],
                                output=list(mul.output))
            attrs = {a.name: onnx.get_attribute_value(a) for a in gate.attribute}
            se.attribute.add(name="gate", type=onnx.AttributeProto.INT, i=int(gate.op_type == "Sigmoid"))
            se.attribute.add(name="alpha", type=onnx.AttributeProto.FLOAT, f=float(attrs.get("alpha", 0.2)))
            se.attribute.add(name="beta", type=onnx.AttributeProto.FLOAT, f=float(attrs.get("beta", 0.5)))
            catalog.ensure_loaded("onnx_prepared", "SqueezeExcite")
            replace[idx] = se
            drop.update((p, c1, r, c2, gi))
            break
    return _rewrite(graph, replace, drop, index)


def forward_initializer_identities(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """Drop every Identity whose input is an initializer and whose output is no graph output, its readers
    reading the initializer instead; returns how many were dropped. Graphs with subgraphs are left alone
    (a body may read the Identity's output by name). Edits in place: only the readers are rewritten."""
    index = index if index is not None else GraphIndex(graph)
    ins_of, outs_of = index.inputs, index.outputs
    forward = {outs_of[i][0]: ins_of[i][0] for i in index.of("Identity")
               if len(ins_of[i]) == 1 and len(outs_of[i]) == 1 and ins_of[i][0] in weights}
    if not forward or index.subgraphs:
        return 0
    for o in index.graph_outputs:
        forward.pop(o, None)
    if not forward:
        return 0
    keep, inputs, gone = [], [], []
    nodes = graph.node
    for idx, ins in enumerate(ins_of):
        if index.op_types[idx] == "Identity" and outs_of[idx] and outs_of[idx][0] in forward:
            gone.append(idx)
            continue
        if any(name in forward for name in ins):
            n = nodes[idx]
            for i, name in enumerate(ins):
                if name in forward:
                    n.input[i] = forward[name]
            ins = tuple(forward.get(name, name) for name in ins)
        keep.append(idx)
        inputs.append(ins)
    for idx in reversed(gone):
        del nodes[idx]
    index.rewired(inputs, keep)
    return len(forward)


# **** transformer encoder fusions (BERT-style exports): fuse_encoder ****


def _default(node: onnx.NodeProto, op: str) -> bool:
    return node.op_type == op and node.domain in ("", "ai.onnx")


def _constants(graph: onnx.GraphProto, index: GraphIndex | None):
    """The graph's default-domain Constant nodes (all nodes without ``index``: the test below sorts them)."""
    if index is None:
        return graph.node
    nodes = graph.node
    return [nodes[i] for i in index.of("Constant")]


def _constant_scalars(graph: onnx.GraphProto, index: GraphIndex | None = None) -> dict[str, float]:
    """Output name -> value of every Constant node holding one float32 scalar (the only constants a
    fusion compares: initializer payloads are not read at resolution)."""
    out: dict[str, float] = {}
    for n in _constants(graph, index):
        if not _default(n, "Constant") or len(n.attribute) != 1 or n.attribute[0].name != "value":
            continue
        t = n.attribute[0].t
        if t.data_type != onnx.TensorProto.FLOAT or any(d != 1 for d in t.dims):
            continue
        if t.float_data and len(t.float_data) == 1:
            out[n.output[0]] = float(t.float_data[0])
        elif len(t.raw_data) == 4:
            out[n.output[0]] = float(np.frombuffer(t.raw_data, "<f4")[0])
    return out


class _Graph:
    """Producer and consumer maps of one graph, the :class:`GraphIndex`'s (each field access of a
    protobuf message builds a wrapper object: the fusion steps read these Python lists instead), and the
    rewrite being collected (``replace``/``drop``). The steps of :func:`fuse_encoder` share one: a
    replacement writes the names of the outputs it replaces, so the maps stay true until the commit."""

    def __init__(self, graph: onnx.GraphProto, index: GraphIndex):
        self.graph = graph
        self.index = index  # read, not changed, until commit
        self.ops: list[str] = index.keys
        self.consumers: dict[str, list[int]] = index.consumers
        self.producer: dict[str, int] = index.producer
        self.outputs = index.graph_outputs
        self.replace: dict[int, onnx.NodeProto] = {}
        self.drop: set[int] = set()

    def of(self, op: str) -> list[int]:
        """Indices of the default-domain ``op`` nodes."""
        return self.index.of(op)

    def taken(self, *idx: int) -> bool:
        return any(i in self.drop or i in self.replace for i in idx)

    def only_reader(self, name: str) -> int | None:
        """The one node reading ``name`` (which the graph does not return), else None."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs or users[0] in self.drop:
            return None
        return users[0]

    def other(self, node: onnx.NodeProto, name: str) -> str | None:
        """The other input of a two-input node one of whose inputs is ``name``."""
        if len(node.input) != 2 or name not in node.input or node.input[0] == node.input[1]:
            return None
        return node.input[1] if node.input[0] == name else node.input[0]

    def commit(self) -> int:
        return _rewrite(self.graph, self.replace, self.drop, self.index)


def _bias_for(g: _Graph, out: str, weights: Mapping, n: int) -> tuple[int, str] | None:
    """(Add index, bias name) when ``out``'s only reader is an Add of a float32 ``[n]`` initializer."""
    u = g.only_reader(out)
    if u is None or not _default(g.graph.node[u], "Add") or len(g.graph.node[u].output) != 1:
        return None
    bias = g.other(g.graph.node[u], out)
    w = weights.get(bias) if bias else None
    if w is None or w.dtype != "float32" or tuple(w.dims) != (n,):
        return None
    return u, bias


def _fuse_matmul_bias(g: _Graph, weights: Mapping) -> None:
    """MatMul(A, W) + Add(bias) (W a float32 2-D initializer, bias a float32 [N] one, the product read by
    the Add alone) -> onnx_prepared::MatMulBias(A, W, bias), prepacked as MatMul is."""
    for idx in g.of("MatMul"):
        mm = g.graph.node[idx]
        if len(mm.input) != 2 or len(mm.output) != 1 or g.taken(idx):
            continue
        w = weights.get(mm.input[1])
        if w is None or w.dtype != "float32" or len(w.dims) != 2 or mm.input[0] in weights:
            continue
        got = _bias_for(g, mm.output[0], weights, int(w.dims[1]))
        if got is None or g.taken(got[0]):
            continue
        u, bias = got
        g.replace[idx] = onnx.NodeProto(op_type="MatMulBias", domain="onnx_prepared", name=mm.name,
                                        input=[mm.input[0], mm.input[1], bias], output=list(g.graph.node[u].output))
        g.drop.add(u)


def _fuse_dynamic_quant_matmul(g: _Graph, weights: Mapping) -> None:
    """``onnxruntime.quantization.quantize_dynamic``'s chain per MatMul, DynamicQuantizeLinear(X) ->
    MatMulInteger(q, W, zp, w_zp) -> Cast(float) -> Mul(., Mul(scale, w_scale)) (-> Add(bias)), ->
    onnx_prepared::DynamicQuantizeMatMul(X, W, w_scale, w_zp, bias) (com.microsoft's op of that name,
    which onnxruntime's own fusion writes). W, w_zp, w_scale (and bias) initializers; every intermediate
    read by the chain alone. The DynamicQuantizeLinear goes once every reader of its outputs is fused."""
    nodes = g.graph.node
    for idx in g.of("DynamicQuantizeLinear"):
        dql = nodes[idx]
        if len(dql.output) != 3 or g.taken(idx):
            continue
        q, s, zp = dql.output
        if {q, s, zp} & g.outputs:
            continue
        readers = set(g.consumers.get(q, [])) | set(g.consumers.get(s, [])) | set(g.consumers.get(zp, []))
        fused_readers: set[int] = set()
        for mi in g.consumers.get(q, []):
            mmi = nodes[mi]
            if (not _default(mmi, "MatMulInteger") or len(mmi.input) != 4 or list(mmi.input[:1]) != [q]
                    or mmi.input[2] != zp or g.taken(mi)):
                continue
            w, wzp = weights.get(mmi.input[1]), weights.get(mmi.input[3])
            if w is None or w.dtype not in ("int8", "uint8") or len(w.dims) != 2 or wzp is None:
                continue
            ci = g.only_reader(mmi.output[0])
            cast = nodes[ci] if ci is not None else None
            if cast is None or not _default(cast, "Cast") or g.taken(ci):
                continue
            if [(a.name, a.i) for a in cast.attribute] != [("to", onnx.TensorProto.FLOAT)]:
                continue
            mi2 = g.only_reader(cast.output[0])
            mul = nodes[mi2] if mi2 is not None else None
            if mul is None or not _default(mul, "Mul") or g.taken(mi2):
                continue
            sm = g.other(mul, cast.output[0])
            si = g.producer.get(sm) if sm else None
            if si is None or not _default(nodes[si], "Mul") or g.only_reader(sm) != mi2 or g.taken(si):
                continue
            w_scale = g.other(nodes[si], s)
            ws = weights.get(w_scale) if w_scale else None
            if ws is None or ws.dtype != "float32" or not (len(ws.dims) == 0 or tuple(ws.dims) in ((1,), (w.dims[1],))):
                continue
            out, bias, drop = list(mul.output), "", {mi, ci, mi2, si}
            got = _bias_for(g, mul.output[0], weights, int(w.dims[1]))
            if got is not None and not g.taken(got[0]):
                bias, out = got[1], list(nodes[got[0]].output)
                drop.add(got[0])
            g.replace[mi] = onnx.NodeProto(op_type="DynamicQuantizeMatMul", domain="onnx_prepared", name=mmi.name,
                                           input=[dql.input[0], mmi.input[1], w_scale, mmi.input[3], bias],
                                           output=out)
            g.drop.update(drop - {mi})
            fused_readers.update((mi, si))
        if fused_readers and readers <= fused_readers:
            g.drop.add(idx)


def _fuse_gelu(g: _Graph, scalars: Mapping[str, float]) -> None:
    """The exact GELU as torch exports it, Mul(Mul(x, Add(Erf(Div(x, d)), a)), m) with Constant scalars
    d ~ sqrt 2, a == 1, m == 0.5 and every intermediate read once -> onnx_prepared::GeluErf(x)
    (attributes d, a, m: the fused kernel repeats the graph's float32 operations)."""
    nodes = g.graph.node
    for idx in g.of("Div"):
        div = nodes[idx]
        if len(div.input) != 2 or g.taken(idx):
            continue
        x, d = div.input
        if abs(scalars.get(d, 0.0) - 2 ** 0.5) > 1e-6:
            continue
        chain = [idx]
        ei = g.only_reader(div.output[0])
        if ei is None or not _default(nodes[ei], "Erf"):
            continue
        chain.append(ei)
        ai = g.only_reader(nodes[ei].output[0])
        if ai is None or not _default(nodes[ai], "Add") or scalars.get(g.other(nodes[ai], nodes[ei].output[0])) != 1.0:
            continue
        chain.append(ai)
        m1 = g.only_reader(nodes[ai].output[0])
        if m1 is None or not _default(nodes[m1], "Mul") or g.other(nodes[m1], nodes[ai].output[0]) != x:
            continue
        chain.append(m1)
        m2 = g.only_reader(nodes[m1].output[0])
        if m2 is None or not _default(nodes[m2], "Mul") or scalars.get(g.other(nodes[m2], nodes[m1].output[0])) != 0.5:
            continue
        chain.append(m2)
        if g.taken(*chain):
            continue
        node = onnx.NodeProto(op_type="GeluErf", domain="onnx_prepared", name=div.name, input=[x],
                              output=list(nodes[m2].output))
        for name, v in (("d", scalars[d]), ("a", 1.0), ("m", 0.5)):
            node.attribute.add(name=name, type=onnx.AttributeProto.FLOAT, f=v)
        g.replace[idx] = node
        g.drop.update(chain[1:])


def _fuse_attention_softmax(g: _Graph, scalars: Mapping[str, float]) -> None:
    """An attention block's scores, Softmax(Add(Div(S, d), mask), axis=-1) with d a non-zero Constant
    scalar and each intermediate read once -> onnx_prepared::ScaledMaskedSoftmax(S, mask) (attribute d;
    the same Div, Add and last-axis Softmax in one call)."""
    nodes = g.graph.node
    for idx in g.of("Div"):
        div = nodes[idx]
        if len(div.input) != 2 or len(div.output) != 1 or g.taken(idx) or not scalars.get(div.input[1]):
            continue
        ai = g.only_reader(div.output[0])
        if ai is None or g.ops[ai] != "Add" or g.taken(ai) or len(nodes[ai].output) != 1:
            continue
        mask = g.other(nodes[ai], div.output[0])
        si = g.only_reader(nodes[ai].output[0])
        if mask is None or si is None or g.ops[si] != "Softmax" or g.taken(si):
            continue
        sm = nodes[si]
        if [(a.name, a.i) for a in sm.attribute] != [("axis", -1)] or len(sm.output) != 1:
            continue
        node = onnx.NodeProto(op_type="ScaledMaskedSoftmax", domain="onnx_prepared", name=sm.name,
                              input=[div.input[0], mask], output=list(sm.output))
        node.attribute.add(name="d", type=onnx.AttributeProto.FLOAT, f=scalars[div.input[1]])
        g.replace[idx] = node
        g.drop.update((ai, si))


def _fuse_add_layer_norm(g: _Graph) -> None:
    """Add(A, B) read by a LayerNormalization as its X -> onnx_prepared::AddLayerNormalization(A, B, Scale,
    Bias) writing the LayerNormalization's outputs and, when anything else reads it (or the graph returns
    it), the sum as a fourth output."""
    nodes = g.graph.node
    for idx in g.of("Add"):
        add = nodes[idx]
        if len(add.input) != 2 or len(add.output) != 1 or g.taken(idx):
            continue
        h = add.output[0]
        users = g.consumers.get(h, [])
        lns = [u for u in users if _default(nodes[u], "LayerNormalization") and nodes[u].input[0] == h
               and h not in nodes[u].input[1:] and not g.taken(u)]
        if not lns:
            continue
        li = lns[0]
        ln = nodes[li]
        if any(a.name not in ("axis", "epsilon", "stash_type") for a in ln.attribute):
            continue
        outs = list(ln.output) + [""] * (3 - len(ln.output))
        keep_sum = len(users) > 1 or h in g.outputs
        node = onnx.NodeProto(op_type="AddLayerNormalization", domain="onnx_prepared", name=ln.name,
                              input=[*add.input, *ln.input[1:]], output=[*outs, h if keep_sum else ""])
        node.attribute.extend(ln.attribute)
        node.attribute.add(name="stats", type=onnx.AttributeProto.INT, i=int(any(outs[1:])))
        g.replace[li] = node
        g.drop.add(idx)


def _swap_gather_dequantize(g: _Graph, weights: Mapping) -> None:
    """Gather(T, idx) -> DequantizeLinear(., scale, zp), T a small quantized initializer and scale/zp
    per-tensor initializers, the gathered rows read by the DequantizeLinear alone -> DequantizeLinear(T,
    scale, zp) -> Gather(., idx): per-tensor dequantization commutes with picking rows (exactly), and a
    DequantizeLinear of initializers is computed once (kernels/dq_fold.py), not per run."""
    nodes = g.graph.node
    for idx in g.of("Gather"):
        ga = nodes[idx]
        if len(ga.input) != 2 or len(ga.output) != 1 or g.taken(idx):
            continue
        t = weights.get(ga.input[0])
        if t is None or t.dtype not in ("int8", "uint8"):
            continue
        from onnx_prepared.kernels.dq_fold import FOLD_MAX_BYTES  # (a model with a quantized table only)

        if int(np.prod(t.dims)) * 4 > FOLD_MAX_BYTES:
            continue
        di = g.only_reader(ga.output[0])
        dq = nodes[di] if di is not None else None
        if dq is None or not _default(dq, "DequantizeLinear") or dq.input[0] != ga.output[0] or g.taken(di):
            continue
        if any(a.name not in ("axis",) for a in dq.attribute) or len(dq.output) != 1:
            continue
        params = [n for n in dq.input[1:] if n]
        if not params or any(n not in weights or int(np.prod(weights[n].dims)) != 1 for n in params):
            continue
        table = f"{ga.input[0]}/dequantized_by/{dq.name or dq.output[0]}"
        fold = onnx.NodeProto(op_type="DequantizeLinear", domain=dq.domain, name=dq.name,
                              input=[ga.input[0], *dq.input[1:]], output=[table])
        fold.attribute.extend(dq.attribute)
        gather = onnx.NodeProto(op_type="Gather", domain=ga.domain, name=ga.name, input=[table, ga.input[1]],
                                output=list(dq.output))
        gather.attribute.extend(ga.attribute)
        g.replace[idx] = fold
        g.replace[di] = gather


def _constant_ints(graph: onnx.GraphProto, index: GraphIndex | None = None) -> dict[str, int | list[int]]:
    """Output name -> value of every Constant node holding an int64 scalar (an int) or 1-D tensor (a list)."""
    out: dict[str, int | list[int]] = {}
    for n in _constants(graph, index):
        if not _default(n, "Constant") or len(n.attribute) != 1 or n.attribute[0].name != "value":
            continue
        t = n.attribute[0].t
        if t.data_type != onnx.TensorProto.INT64 or len(t.dims) > 1:
            continue
        v = list(t.int64_data) if t.int64_data else np.frombuffer(t.raw_data, "<i8").tolist()
        if len(v) != (int(t.dims[0]) if t.dims else 1):
            continue
        out[n.output[0]] = v if t.dims else v[0]
    return out


def _shape_element(g: _Graph, name: str, ints: Mapping, concat: int) -> tuple[int, int, int, str] | None:
    """(Unsqueeze, Gather, Shape index, Gather's index) and the shaped tensor when ``name`` (read by the
    Concat ``concat`` alone) is Unsqueeze(Gather(Shape(S), scalar constant), axes [0]); else None."""
    nodes = g.graph.node
    ui = g.producer.get(name)
    if ui is None or g.ops[ui] != "Unsqueeze" or g.only_reader(name) != concat or g.taken(ui):
        return None
    un = nodes[ui]
    axes = ints.get(un.input[1]) if len(un.input) > 1 else [int(i) for a in un.attribute if a.name == "axes"
                                                             for i in a.ints]
    if axes != [0] or len(un.output) != 1:
        return None
    gi = g.producer.get(un.input[0])
    if gi is None or g.ops[gi] != "Gather" or g.taken(gi):
        return None
    ga = nodes[gi]
    if len(ga.input) != 2 or not isinstance(ints.get(ga.input[1]), int) or any(
            a.name != "axis" or a.i != 0 for a in ga.attribute):
        return None
    si = g.producer.get(ga.input[0])
    if si is None or g.ops[si] != "Shape" or g.taken(si) or len(nodes[si].attribute) or len(nodes[si].input) != 1:
        return None
    return ui, gi, si, nodes[si].input[0], ints[ga.input[1]]


def _reshape_of_concat(g: _Graph) -> bool:
    """Whether a two-input Reshape reads a Concat's output as its shape (the pattern's root): without one
    the Constant nodes' values are not read."""
    inputs = g.index.inputs
    for ri in g.of("Reshape"):
        ci = g.producer.get(inputs[ri][1]) if len(inputs[ri]) == 2 else None
        if ci is not None and g.ops[ci] == "Concat":
            return True
    return False


def _fuse_reshape_from_shape(g: _Graph, ints: Mapping) -> None:
    """Reshape(X, Concat(Unsqueeze(Gather(Shape(S), i)), ..., int64 constants)) (axis 0, one S, every
    intermediate read by the chain alone) -> onnx_prepared::ReshapeFromShape(X, S) (attributes index,
    copied, values: the shape tensor S's dims and the constants make, built in the run as the chain
    built it, then Reshape's own rules). The Gathers and Shapes go when nothing else reads them."""
    nodes = g.graph.node
    gathers: set[int] = set()
    for ri in g.of("Reshape"):
        rs = nodes[ri]
        if len(rs.input) != 2 or len(rs.output) != 1 or g.taken(ri):
            continue
        ci = g.producer.get(rs.input[1])
        if ci is None or g.ops[ci] != "Concat" or g.only_reader(rs.input[1]) != ri or g.taken(ci):
            continue
        concat = nodes[ci]
        if [(a.name, a.i) for a in concat.attribute] != [("axis", 0)]:
            continue
        index, copied, values, chain, src, found = [], [], [], [ci], None, set()
        for name in concat.input:
            v = ints.get(name)
            if isinstance(v, list):
                index += [0] * len(v)
                copied += [0] * len(v)
                values += v
                continue
            got = _shape_element(g, name, ints, ci)
            if got is None or (src is not None and got[3] != src):
                break
            ui, gi, si, src, i = got
            chain.append(ui)
            found.add(gi)
            index.append(i)
            copied.append(1)
            values.append(0)
        else:
            if src is None or min(values, default=0) < -1:  # below -1: the Reshape kernel refuses it
                continue
            node = onnx.NodeProto(op_type="ReshapeFromShape", domain="onnx_prepared", name=rs.name,
                                  input=[rs.input[0], src], output=list(rs.output))
            node.attribute.add(name="index", type=onnx.AttributeProto.INTS, ints=index)
            node.attribute.add(name="copied", type=onnx.AttributeProto.INTS, ints=copied)
            node.attribute.add(name="values", type=onnx.AttributeProto.INTS, ints=values)
            az = [a.i for a in rs.attribute if a.name == "allowzero"]
            node.attribute.add(name="allowzero", type=onnx.AttributeProto.INT, i=az[0] if az else 0)
            g.replace[ri] = node
            g.drop.update(chain)
            gathers |= found
    shapes: set[int] = set()
    for gi in gathers:  # a Gather (then its Shape) goes once every reader of it went
        out = nodes[gi].output[0]
        if out not in g.outputs and all(u in g.drop for u in g.consumers.get(out, [])):
            g.drop.add(gi)
            shapes.add(g.producer[nodes[gi].input[0]])
    for si in shapes:
        out = nodes[si].output[0]
        if out not in g.outputs and all(u in g.drop for u in g.consumers.get(out, [])):
            g.drop.add(si)


def fuse_encoder(graph: onnx.GraphProto, weights: Mapping, index: GraphIndex | None = None) -> int:
    """The transformer-encoder fusions, each where its pattern matches exactly: the int8 dynamic-quant
    MatMul chain, MatMul + bias Add, the Erf GELU, the attention's scaled masked Softmax, Add +
    LayerNormalization, a quantized embedding's
    Gather + DequantizeLinear turned round and a Reshape to a shape built from another tensor's dims
    (in that order, over one set of maps: the bias Adds are taken
    before a residual Add + LayerNormalization is looked for); returns how many nodes were written.
    Graphs with subgraphs are left alone (a body may read an intermediate by name)."""
    index = index if index is not None else GraphIndex(graph)
    # (the DequantizeLinear step turns a Gather's round: without a Gather there is nothing for it)
    gather_dq = index.has("Gather") and index.has("DequantizeLinear")
    if not gather_dq and not index.has("MatMul", "MatMulInteger", "Erf", "LayerNormalization", "Reshape", "Softmax"):
        return 0
    if index.subgraphs:
        return 0
    g = _Graph(graph, index)
    scalars = _constant_scalars(graph, index) if index.has("Erf", "Softmax") else {}
    steps = (("MatMulInteger", lambda: _fuse_dynamic_quant_matmul(g, weights)),
             ("MatMul", lambda: _fuse_matmul_bias(g, weights)),
             ("Erf", lambda: _fuse_gelu(g, scalars)),
             ("Softmax", lambda: _fuse_attention_softmax(g, scalars)),
             ("LayerNormalization", lambda: _fuse_add_layer_norm(g)),
             ("DequantizeLinear", lambda: _swap_gather_dequantize(g, weights)),
             ("Reshape", lambda: _reshape_of_concat(g) and _fuse_reshape_from_shape(g, _constant_ints(graph, index))))
    for needs, step in steps:
        if index.has(needs) and (needs != "DequantizeLinear" or gather_dq):
            step()
    for node in g.replace.values():
        if node.domain == "onnx_prepared":
            catalog.ensure_loaded("onnx_prepared", node.op_type)
    return g.commit()
