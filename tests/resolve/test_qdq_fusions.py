"""QDQ groups rewritten as onnxruntime's CPU QDQ transformer does (resolve/fusions_qdq.py): the fused model
computes onnxruntime's integers (its QLinear kernels), and groups onnxruntime leaves alone stay as written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared import onnx_proto
from onnx_prepared.kernels import native
from onnx_prepared.resolve.fusions_qdq import fuse_qdq

MS = "com.microsoft"
RNG = np.random.default_rng(77)


def _init(name, v):
    return numpy_helper.from_array(np.asarray(v), name)


def _qdq_model(act=np.uint8, conv_users=1, flatten_same=True):
    """x -> Q -> DQ -> Conv(DQ w, DQ b) -> Q -> DQ -> {Add with itself's DQ branch} -> Q -> DQ -> GAP -> Q -> DQ
    -> Flatten -> Q -> DQ -> Gemm(DQ w, DQ b) -> Q -> DQ -> y."""
    zp = 0 if act == np.int8 else 128
    inits = [
        _init("s_in", np.float32(0.03)), _init("z_in", act(zp if act == np.uint8 else 0)),
        _init("w", RNG.integers(-63, 64, (8, 3, 3, 3)).astype(np.int8)), _init("s_w", np.float32(0.01)),
        _init("z_w", np.int8(0)),
        _init("b", RNG.integers(-400, 400, 8).astype(np.int32)), _init("s_b", np.float32(0.0003)),
        _init("z_b", np.int32(0)),
        _init("s_c", np.float32(0.05)), _init("z_c", act(10 if act == np.uint8 else -3)),
        _init("s_a", np.float32(0.07)), _init("z_a", act(20 if act == np.uint8 else 1)),
        _init("s_g", np.float32(0.02)), _init("z_g", act(30 if act == np.uint8 else 2)),
        _init("s_f", np.float32(0.02 if flatten_same else 0.021)),
        _init("fw", RNG.integers(-63, 64, (5, 8)).astype(np.int8)), _init("s_fw", np.float32(0.02)),
        _init("z_fw", np.int8(0)),
        _init("fb", RNG.integers(-99, 99, 5).astype(np.int32)), _init("s_fb", np.float32(0.0004)),
        _init("z_fb", np.int32(0)),
        _init("s_y", np.float32(0.1)), _init("z_y", act(100 if act == np.uint8 else 0)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_in", "z_in"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s_in", "z_in"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "s_w", "z_w"], ["wd"]),
        helper.make_node("DequantizeLinear", ["b", "s_b", "z_b"], ["bd"]),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "s_c", "z_c"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "s_c", "z_c"], ["cd"]),
        helper.make_node("Add", ["cd", "cd"], ["a"]),
        helper.make_node("QuantizeLinear", ["a", "s_a", "z_a"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "s_a", "z_a"], ["ad"]),
        helper.make_node("GlobalAveragePool", ["ad"], ["g"]),
        helper.make_node("QuantizeLinear", ["g", "s_g", "z_g"], ["gq"]),
        helper.make_node("DequantizeLinear", ["gq", "s_g", "z_g"], ["gd"]),
        helper.make_node("Flatten", ["gd"], ["f"]),
        helper.make_node("QuantizeLinear", ["f", "s_f" if not flatten_same else "s_g", "z_g"], ["fq"]),
        helper.make_node("DequantizeLinear", ["fq", "s_f" if not flatten_same else "s_g", "z_g"], ["fd"]),
        helper.make_node("DequantizeLinear", ["fw", "s_fw", "z_fw"], ["fwd"]),
        helper.make_node("DequantizeLinear", ["fb", "s_fb", "z_fb"], ["fbd"]),
        helper.make_node("Gemm", ["fd", "fwd", "fbd"], ["m"], transB=1),
        helper.make_node("QuantizeLinear", ["m", "s_y", "z_y"], ["mq"]),
        helper.make_node("DequantizeLinear", ["mq", "s_y", "z_y"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if conv_users == 2:
        outputs.append(helper.make_tensor_value_info("c2", TensorProto.FLOAT, None))
        nodes.append(helper.make_node("Relu", ["c"], ["c2"]))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 9])],
                              outputs, initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _ops(model: bytes) -> list[str]:
    import onnx_prepared

    sess = onnx_prepared.InferenceSession(model)
    return sess, [k.name.split(":")[1].split("-")[0] if k.name.startswith("prepacked") else k.name
                  for k in sess._rt.resolved.kernels]


def _against_ort(model: bytes, sess, level: str) -> None:
    import onnxruntime as ort

    x = (RNG.standard_normal((2, 3, 9, 9)) * 2).astype(np.float32)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    if level == "numpy":
        saved, native._ext = native._ext, None
        try:
            ours = sess.run(None, {"x": x})
        finally:
            native._ext = saved
    else:
        with native.forced_level(level):
            ours = sess.run(None, {"x": x})
    np.testing.assert_array_equal(ours[0], ref[0])  # the dequantized integers: exact
    for a, b in zip(ours[1:], ref[1:]):  # a float output (the unfused Conv's Relu)
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("level", [*native.supported_levels(), "numpy"])
def test_qdq_groups_become_onnxruntimes_qlinear_ops(level):
    model = _qdq_model()
    sess, ops = _ops(model)
    assert ops == ["qparams", "qconv", "qparams", "qparams", "ai.onnx::Flatten-1", "qgemm", "qparams"], ops
    kinds = [k.name for k in sess._rt.resolved.kernels]
    assert [k.split("-")[1] for k in kinds if k.startswith("prepacked:qparams")] == ["quantize", "add", "gap",
                                                                                      "dequantize"]
    _against_ort(model, sess, level)


def test_groups_onnxruntime_does_not_fuse_stay_as_written():
    """int8 activations into a Conv (onnxruntime's int8 QLinearConv depends on its build), a Conv output
    read by a second node, and a Flatten between different parameters keep their float ops."""
    _, ops = _ops(_qdq_model(act=np.int8))
    assert "ai.onnx::Conv-1" in ops and "qconv" not in ops
    model = _qdq_model(conv_users=2)
    sess, ops = _ops(model)
    assert "ai.onnx::Conv-1" in ops and "qconv" not in ops
    _against_ort(model, sess, native.dispatch_level() if native.available() else "numpy")
    _, ops = _ops(_qdq_model(flatten_same=False))
    assert ops.count("qparams") == 6 and "qgemm" in ops  # the Flatten's Q/DQ stay, the Gemm still fuses


def test_a_graph_without_quantize_linear_is_untouched():
    g = onnx_proto.GraphProto()
    g.node.add(op_type="Relu", input=["x"], output=["y"])
    assert fuse_qdq(g, {}) == 0 and len(g.node) == 1


@pytest.mark.parametrize("case", ["groups", "lookup"])
def test_fusion_reads_and_updates_the_resolver_index_without_a_rescan(monkeypatch, case):
    """The selectors read the resolver's GraphIndex (not a rescan of the nodes), and the rewrite updates it
    from the nodes it wrote: afterwards it describes the graph as a fresh index of it does."""
    from onnx_prepared.model import load_model_bytes
    from onnx_prepared.resolve.graph_index import GraphIndex

    data, n, ops = {
        "groups": (_qdq_model(), 5, ["QuantizeLinear", "QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool",
                                     "Flatten", "QGemm", "DequantizeLinear"]),  # Conv, Add, GAP, Flatten, Gemm
        "lookup": (_chain_model("HardSigmoid", np.uint8, alpha=0.25), 1, ["QuantizeLinear", "QLookup"]),
    }[case]
    model = load_model_bytes(data, ".")
    g = onnx_proto.GraphProto()
    g.CopyFrom(model.graph)
    index = GraphIndex(g)
    monkeypatch.setattr(GraphIndex, "rescan", lambda self: pytest.fail("fuse_qdq rescanned the graph"))
    assert fuse_qdq(g, model.weights, index) == n
    monkeypatch.undo()
    fresh = GraphIndex(g)
    for lst in ("op_types", "domains", "names", "keys", "inputs", "outputs"):
        assert getattr(index, lst) == getattr(fresh, lst), lst
    assert [index.attributes(i) for i in range(len(g.node))] == [fresh.attributes(i) for i in range(len(g.node))]
    assert index.op_types == ops


def _chain_model(op: str, dtype, **attrs) -> bytes:
    z_in, z_out = (dtype(-5), dtype(-128)) if dtype == np.int8 else (dtype(120), dtype(0))
    inits = [_init("s", np.float32(0.04)), _init("z", z_in), _init("s2", np.float32(1 / 255)), _init("z2", z_out)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node(op, ["d"], ["f"], **attrs),
             helper.make_node("QuantizeLinear", ["f", "s2", "z2"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 9])],
                              [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                             None)], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("level", [*native.supported_levels(), "numpy"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("op", "attrs"), [("Relu", {}), ("HardSigmoid", {"alpha": 1 / 6}), ("HardSigmoid", {})])
def test_float_op_between_dequantize_and_quantize_is_one_table(level, dtype, op, attrs):
    model = _chain_model(op, dtype, **attrs)
    sess, ops = _ops(model)
    assert ops == ["qparams", "qlookup"], ops
    _against_ort(model, sess, level)


def test_unpacked_lookup_computes_the_chain():
    from onnx_prepared.kernels import activation
    from onnx_prepared.kernels.qlinear_packed import q_lookup
    from onnx_prepared.kernels.quantize import dequantize_linear, quantize_linear

    x = np.arange(256, dtype=np.uint8).view(np.int8).reshape(4, 64)
    s, z, s2, z2 = np.float32(0.03), np.int8(3), np.float32(0.005), np.int8(-100)
    (y,) = q_lookup(x, s, z, s2, z2, function=b"HardSigmoid", alpha=0.25, beta=0.4)
    (d,) = dequantize_linear(x, np.asarray(s), np.asarray(z))
    (f,) = activation.hard_sigmoid(d, alpha=0.25, beta=0.4)
    np.testing.assert_array_equal(y, quantize_linear(f, np.asarray(s2), np.asarray(z2))[0])
