"""Schema type constraints are checked at load (model/types.py), as onnxruntime checks them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import ModelLoadError
from onnx_prepared.model import load_model_bytes
from onnx_prepared.runtime import RuntimeSession

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def _model(op, input_types, *, inits=(), out_type=F, opset=17, **attrs):
    """One node ``op`` over inputs x0.. of ``input_types``; ``inits`` are (name, array) initializers used as inputs."""
    names = [f"x{i}" for i in range(len(input_types))]
    ins = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, input_types)]
    names += [n for n, _ in inits]
    node = helper.make_node(op, names, ["y"], name=f"the_{op.lower()}", **attrs)
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", out_type, None)],
                          initializer=[numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ort_refuses(m) -> bool:
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return True
    return False


BAD = [
    ("Add", _model("Add", [F, I64])),
    ("Mul initializer", _model("Mul", [F], inits=[("c", np.ones(3, np.int32))])),
    ("MatMul", _model("MatMul", [F], inits=[("w", np.ones((3, 3), np.float64))])),
    ("Concat", _model("Concat", [F, F, I64], axis=0)),
    ("Conv", _model("Conv", [F], inits=[("w", np.ones((1, 1, 1, 1), np.float16))])),
    ("Where", _model("Where", [TensorProto.BOOL, F, I32])),
    ("downstream", None),  # filled below: a type propagated through an earlier node
    ("not allowed", _model("Sqrt", [I64], out_type=I64)),  # Sqrt's T is float types only
]


def _downstream():
    ins = [helper.make_tensor_value_info("a", F, None), helper.make_tensor_value_info("b", I64, None)]
    nodes = [helper.make_node("Relu", ["a"], ["r"], name="relu"), helper.make_node("Shape", ["a"], ["s"]),
             helper.make_node("Add", ["r", "s"], ["y"], name="add_r_s")]  # float + int64 (Shape's T1)
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


BAD[6] = ("downstream", _downstream())


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_mismatched_element_types_are_refused_naming_the_node(tmp_path, case):
    _, m = case
    assert _ort_refuses(m)  # the reference refuses it too
    with pytest.raises(ModelLoadError, match=r"node '(the_|add_r_s|the_sqrt)"):
        load_model_bytes(m.SerializeToString(), ".")


def test_matching_types_load_and_run_as_onnxruntime():
    m = _model("Add", [F], inits=[("c", np.arange(3, dtype=np.float32))])
    assert not _ort_refuses(m)
    x = np.ones(3, np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x0": x})
    with RuntimeSession(load_model_bytes(m.SerializeToString(), ".")) as s:
        np.testing.assert_array_equal(s.run({"x0": x})[0], want[0])


def test_unknown_types_are_not_guessed():
    """Cast's output type comes from an attribute, not a type parameter: unknown, never refused by guess."""
    ins = [helper.make_tensor_value_info("a", F, None), helper.make_tensor_value_info("b", I64, None)]
    nodes = [helper.make_node("Cast", ["b"], ["c"], to=F), helper.make_node("Add", ["a", "c"], ["y"])]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert not _ort_refuses(m)
    load_model_bytes(m.SerializeToString(), ".")
