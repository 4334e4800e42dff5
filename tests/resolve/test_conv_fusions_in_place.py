"""The Conv fusions (resolve/fusions.py ``fuse_conv_batchnorm``, ``fuse_conv_activation``) rewrite the Conv
node in place and hand the GraphIndex the fused node's fields and attributes: those must be exactly what
reading the written node back gives (``parse_attributes``, the node's own fields), and the written node
what a freshly built FusedConv would be."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.bind.attributes import parse_attributes
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from onnx_prepared.resolve.fusions import fuse_conv_activation, fuse_conv_batchnorm
from onnx_prepared.resolve.graph_index import GraphIndex
from onnx_prepared.resolve.resolver import _skeleton

RNG = np.random.default_rng(5)


def _scalar(name, v):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32), name))


def _acts(kind, x):
    if kind == "relu":
        return [helper.make_node("Relu", [x], ["y"])]
    if kind == "leaky":
        return [helper.make_node("LeakyRelu", [x], ["y"], alpha=0.3)]  # 0.3 is not a float32
    if kind == "clip_constants":
        return [_scalar("lo", 0.1), _scalar("hi", 6.0), helper.make_node("Clip", [x, "lo", "hi"], ["y"])]
    return [helper.make_node("HardSwish", [x], ["y"])]


def _model(tmp_path, *, bn, bias, act, opset=14):
    m, c = 8, 4
    inits = [numpy_helper.from_array(RNG.standard_normal((m, c, 3, 3)).astype(np.float32), "W")]
    conv_in = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "B"))
        conv_in.append("B")
    nodes = [helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1])]
    cur = "c"
    if bn:
        for nm in ("s", "bb", "mu", "var"):
            inits.append(numpy_helper.from_array(RNG.uniform(0.5, 2, m).astype(np.float32), nm))
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], epsilon=1.1e-5))
        cur = "n"
    nodes += _acts(act, cur) if act else []
    out = "y" if act else cur
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 6])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    p = str(tmp_path / "m.onnx")
    onnx.save(model, p)
    return p


@pytest.mark.parametrize("bn", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", [None, "relu", "leaky", "clip_constants", "hardswish"])
def test_index_holds_what_the_written_nodes_say(tmp_path, bn, bias, act):
    loaded = load_model(_model(tmp_path, bn=bn, bias=bias, act=act))
    graph = _skeleton(loaded.graph)
    index = GraphIndex(graph, subgraphs=False, facts=loaded.node_facts)
    n = fuse_conv_batchnorm(graph, loaded.weights, index) + fuse_conv_activation(graph, loaded.weights, index)
    assert n == int(bn) + int(act is not None)
    assert len(index.op_types) == len(graph.node)
    fused = 0
    for i, node in enumerate(graph.node):
        assert (index.op_types[i], index.domains[i], index.names[i]) == (node.op_type, node.domain, node.name)
        assert index.inputs[i] == tuple(node.input) and index.outputs[i] == tuple(node.output)
        got, want = index.attributes(i), parse_attributes(node)
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert type(got[k]) is type(v) and got[k] == v, k
        if node.op_type == "FusedConv":
            fused += 1
            assert node.output[0] == ("y" if act else "n")
            want_in = ["x", "W"] + (["B"] if bias else [""] if bn else []) + (["s", "bb", "mu", "var"] if bn else [])
            assert list(node.input) == want_in
    assert fused == (1 if bn or act else 0)


def test_in_place_fusion_writes_the_graph_a_built_node_would(tmp_path):
    """The resolved graph (what the plan and ``inspect`` read) holds the FusedConv as the earlier rebuild
    wrote it: Conv's attributes, then bn_epsilon, then the activation's."""
    p = _model(tmp_path, bn=True, bias=False, act="leaky")
    (node,) = [n for n in resolve_model(load_model(p)).graph().node if n.op_type == "FusedConv"]
    assert node.domain == "onnx_prepared" and node.name == "conv"
    assert list(node.input) == ["x", "W", "", "s", "bb", "mu", "var"] and list(node.output) == ["y"]
    assert [a.name for a in node.attribute] == ["pads", "strides", "bn_epsilon", "activation_lo", "activation_hi",
                                                "activation_act", "activation_alpha"]
    attrs = parse_attributes(node)
    assert attrs["bn_epsilon"] == float(np.float32(1.1e-5)) and attrs["activation_alpha"] == float(np.float32(0.3))
    assert attrs["activation_act"] == 2
