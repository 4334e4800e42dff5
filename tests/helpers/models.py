"""Small models with external data for tests (built with onnx.helper, fixed seeds)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save_external(model: onnx.ModelProto, folder: str | os.PathLike, name: str = "model.onnx") -> str:
    path = os.path.join(os.fspath(folder), name)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=name.replace(".onnx", ".data"), size_threshold=0)
    return path


def relu_add(folder) -> str:
    """y = Relu(x) + x over float32 [2, 3], opset 17: a plain model of two known kernels."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Add", ["h", "x"], ["y"])],
                          "g", [x], [y])
    path = os.path.join(os.fspath(folder), "m.onnx")
    with open(path, "wb") as f:
        f.write(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def gemm_mlp(folder, *, layers: int = 3, width: int = 16, seed: int = 0, share_b: bool = False,
             alpha: float = 1.0, beta: float = 1.0) -> str:
    """x -> [Gemm(transB alternating) -> Relu] * layers; optionally two Gemms read one B."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        trans_b = i % 2
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        name = "W0" if share_b else f"W{i}"
        if not share_b or i == 0:
            inits.append(numpy_helper.from_array(w, name))
        inits.append(numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node("Gemm", [prev, name, f"c{i}"], [f"g{i}"], name=f"gemm{i}",
                                      transB=trans_b, alpha=alpha, beta=beta))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["n", width])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return save_external(m, folder)


def reference_mlp(path: str, x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(path).run(None, {"x": x})[0]


def add_checksums(path: str) -> None:
    """Record the sha256 of every external tensor's bytes in its external_data (as the generator does)."""
    import hashlib

    m = onnx.load(path, load_external_data=False)
    folder = os.path.dirname(path)
    for t in m.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if "location" not in info:
            continue
        with open(os.path.join(folder, info["location"]), "rb") as f:
            f.seek(int(info.get("offset", 0)))
            data = f.read(int(info["length"]))
        for e in list(t.external_data):
            if e.key == "checksum":
                t.external_data.remove(e)
        t.external_data.add(key="checksum", value=hashlib.sha256(data).hexdigest())
    onnx.save(m, path)


def rewrite_tensor(path: str, name: str, value: np.ndarray) -> None:
    """Overwrite one external tensor's bytes in place (same size) and refresh every checksum."""
    m = onnx.load(path, load_external_data=False)
    folder = os.path.dirname(path)
    t = next(t for t in m.graph.initializer if t.name == name)
    info = {e.key: e.value for e in t.external_data}
    data = np.ascontiguousarray(value).tobytes()
    assert len(data) == int(info["length"])
    with open(os.path.join(folder, info["location"]), "r+b") as f:
        f.seek(int(info.get("offset", 0)))
        f.write(data)
    add_checksums(path)


def conv_node_model(op_type: str, rng: np.random.Generator, xs, ws, attrs: dict, bias: bool) -> onnx.ModelProto:
    """One opset-11 Conv or ConvTranspose over input shape ``xs`` with weight shape ``ws`` (and a bias, sized
    by the op's output channels), weights drawn from ``rng`` in that order."""
    inits = [numpy_helper.from_array(rng.standard_normal(ws).astype(np.float32), "W")]
    ins = ["x", "W"]
    if bias:
        m = ws[0] if op_type == "Conv" else ws[1] * attrs.get("group", 1)
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "B"))
        ins.append("B")
    node = helper.make_node(op_type, ins, ["y"], **attrs)
    name = "conv" if op_type == "Conv" else "convT"
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    return model


def conv_transpose_model(rng: np.random.Generator, xs, ws, attrs: dict, bias: bool) -> onnx.ModelProto:
    """:func:`conv_node_model` for one ConvTranspose."""
    return conv_node_model("ConvTranspose", rng, xs, ws, attrs, bias)
