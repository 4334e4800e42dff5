"""The load's node facts: what validation read of each graph node, which resolution uses instead of the
protobuf nodes; they must say exactly what the nodes say (and decline what they do not convert)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_prepared.bind import parse_attributes
from onnx_prepared.errors import ModelLoadError
from onnx_prepared.model import describe_model, load_model, load_model_bytes
from onnx_prepared.resolve import resolve_model


def _model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "W")
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1], group=1),
        helper.make_node("LeakyRelu", ["c"], ["l"], alpha=0.2),
        helper.make_node("Constant", [], ["k"], name="const", value=numpy_helper.from_array(np.float32(2.0))),
        helper.make_node("Mul", ["l", "k"], ["m"]),
        helper.make_node("DepthToSpace", ["m"], ["d"], blocksize=2, mode="CRD"),
        helper.make_node("Resize", ["d", "", "sc"], ["r"], mode="nearest",
                         coordinate_transformation_mode="asymmetric"),
        helper.make_node("Identity", ["r"], ["y"], domain="", doc_string="kept"),
    ]
    sc = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)], [w, sc])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_facts_say_what_the_nodes_say(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    loaded = load_model(str(path))
    nodes = loaded.graph.node
    assert len(loaded.node_facts) == len(nodes)
    for f, node in zip(loaded.node_facts, nodes):
        op, domain, name, ins, outs, attrs, schema = f
        assert (op, domain, name, ins, outs) == (node.op_type, node.domain, node.name, tuple(node.input),
                                                 tuple(node.output))
        assert schema is not None and schema.since_version <= 17
        if node.op_type == "Constant":  # an inline tensor: converted as parse_attributes converts it
            want = parse_attributes(node)
            assert list(attrs) == ["value"] == list(want)
            assert attrs["value"].dtype == want["value"].dtype and np.array_equal(attrs["value"], want["value"])
        else:
            assert attrs == parse_attributes(node), node.op_type
    assert loaded.node_facts[4][5] == {"blocksize": 2, "mode": "CRD"}


def test_an_external_constant_is_left_to_the_node(tmp_path):
    """A Constant whose tensor lives in a data file is not converted at load (the builder inlines it
    before resolution, which then parses the node), and the load still lists it as a nested external."""
    t = numpy_helper.from_array(np.arange(64, dtype=np.float32), "k")
    from onnx.external_data_helper import set_external_data

    (tmp_path / "k.bin").write_bytes(t.raw_data)
    set_external_data(t, "k.bin")
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    g = helper.make_graph([helper.make_node("Constant", [], ["k"], value=t), helper.make_node("Neg", ["k"], ["y"])],
                          "g", [], [helper.make_tensor_value_info("y", T.FLOAT, [64])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    loaded = load_model(str(path))
    assert loaded.node_facts[0][5] is None and loaded.node_facts[1][5] == {}
    assert [n.desc.payload.length for n in loaded.nested_external] == [256]
    import onnx_prepared

    (y,) = onnx_prepared.InferenceSession(str(path)).run(None, {})
    np.testing.assert_array_equal(y, -np.arange(64, dtype=np.float32))


def test_resolution_from_facts_equals_resolution_from_the_protobuf(tmp_path):
    m = _model()
    from_file = resolve_model(load_model_bytes(m.SerializeToString(), str(tmp_path)))
    from_proto = resolve_model(describe_model(m, str(tmp_path)))  # no facts: every node is read
    assert describe_model(m, str(tmp_path)).node_facts == ()
    assert from_file.kernel_choices == from_proto.kernel_choices
    assert from_file.node_io == from_proto.node_io
    assert from_file.node_meta == from_proto.node_meta
    assert from_file.graph_bytes == from_proto.graph_bytes


def test_type_errors_name_the_node_on_the_facts_path(tmp_path):
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="adder")], "g",
                          [helper.make_tensor_value_info("a", T.FLOAT, [2]),
                           helper.make_tensor_value_info("b", T.INT64, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(ModelLoadError, match=r"node 'adder' \(Add, opset 14\): type parameter T is bound to "
                                             r"different types: tensor\(float\)"):
        load_model_bytes(data, str(tmp_path))


def test_facts_of_a_node_outside_the_onnx_domains(tmp_path):
    nodes = [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft", approximate="tanh", scale=0.5, axes=[1, 2]),
             helper.make_node("Custom", ["g"], ["y"], domain="my.domain", t=numpy_helper.from_array(np.ones(2)))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                                            helper.make_opsetid("my.domain", 1)])
    loaded = load_model_bytes(m.SerializeToString(), str(tmp_path))
    gelu, custom = loaded.node_facts
    assert gelu[:5] == ("Gelu", "com.microsoft", "", ("x",), ("g",)) and gelu[6] is None
    assert gelu[5] == {"approximate": "tanh", "scale": 0.5, "axes": [1, 2]} == parse_attributes(loaded.graph.node[0])
    assert custom[5] is None  # a tensor attribute: the node is asked
