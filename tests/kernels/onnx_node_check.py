"""Run one ONNX node through our fast kernel and through ``onnx.reference``; compare exactly enough.

Used by the per-module kernel tests (test_gemm.py, test_elementwise.py, ...). The node is bound with the
real binder, so a test also proves that the fast kernel (not the fallback) accepts the node's attributes.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from onnx_prepared.bind import bind_node


def _value_info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    if value.dtype == object:
        elem = onnx.TensorProto.STRING
    else:
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    return helper.make_tensor_value_info(name, elem, None)


def run_ours(op_type: str, inputs: list[np.ndarray | None], *, opset: int, n_outputs: int = 1,
             **attrs) -> tuple[np.ndarray, ...]:
    """Our fast kernel's outputs for a single node (for cases where onnx.reference itself is wrong)."""
    in_names = ["" if v is None else f"x{i}" for i, v in enumerate(inputs)]
    node = helper.make_node(op_type, in_names, [f"y{i}" for i in range(n_outputs)], **attrs)
    bound = bind_node(node, {"": opset})
    assert not bound.is_fallback, f"{op_type}-{opset} {sorted(attrs)} went to the fallback ({bound.name})"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # our kernels stay quiet on inf/NaN/overflow, like onnxruntime
        return bound.call(*inputs)


def single_node_model(op_type: str, inputs: list[np.ndarray | None], *, opset: int, n_outputs: int = 1,
                      **attrs) -> onnx.ModelProto:
    in_names = ["" if v is None else f"x{i}" for i, v in enumerate(inputs)]
    out_names = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, in_names, out_names, **attrs)
    graph = helper.make_graph(
        [node],
        "single",
        [_value_info(n, v) for n, v in zip(in_names, inputs) if n],
        [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


def run_ort(op_type: str, inputs: list[np.ndarray | None], *, opset: int, n_outputs: int = 1,
            out_elem: int | list[int] | None = None, **attrs) -> list[np.ndarray]:
    """onnxruntime's outputs for a single node (the reference where onnx.reference is wrong or missing).

    ORT wants typed outputs: ``out_elem`` (default: the first input's element type), one per output
    when a list.
    """
    import onnxruntime as ort

    model = single_node_model(op_type, inputs, opset=opset, n_outputs=n_outputs, **attrs)
    elem = out_elem or _value_info("", inputs[0]).type.tensor_type.elem_type
    elems = elem if isinstance(elem, list) else [elem] * len(model.graph.output)
    for o, e in zip(model.graph.output, elems):
        o.type.tensor_type.elem_type = e
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {f"x{i}": v for i, v in enumerate(inputs) if v is not None})


def run_both(
    op_type: str,
    inputs: list[np.ndarray | None],
    *,
    opset: int,
    n_outputs: int = 1,
    **attrs,
) -> tuple[tuple[np.ndarray, ...], list[np.ndarray]]:
    """(our outputs, reference outputs) for a single ``op_type`` node; ``None`` inputs are omitted."""
    ours = run_ours(op_type, inputs, opset=opset, n_outputs=n_outputs, **attrs)
    assert isinstance(ours, tuple), type(ours)
    model = single_node_model(op_type, inputs, opset=opset, n_outputs=n_outputs, **attrs)
    feeds = {f"x{i}": v for i, v in enumerate(inputs) if v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ReferenceEvaluator(model).run(None, feeds)
    return ours, ref


def assert_same(ours, ref, *, rtol: float = 1e-6, atol: float = 0.0) -> None:
    """Same count, dtype and shape; values equal (floats within ``rtol``/``atol``, NaN == NaN)."""
    assert len(ours) == len(ref), (len(ours), len(ref))
    for o, r in zip(ours, ref):
        assert isinstance(o, np.ndarray), f"kernel returned {type(o).__name__}, not ndarray"
        r = np.asarray(r)
        assert o.dtype == r.dtype, (o.dtype, r.dtype)
        assert o.shape == r.shape, (o.shape, r.shape)
        if o.dtype == object or o.dtype.kind in "biuU":
            np.testing.assert_array_equal(o, r)
        elif o.dtype.kind == "f" and o.dtype.itemsize >= 4:
            np.testing.assert_allclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
        else:  # float16 and the ml_dtypes types: compare their float32 values
            np.testing.assert_allclose(o.astype(np.float32), r.astype(np.float32), rtol=rtol, atol=atol,
                                       equal_nan=True)


def check(op_type: str, inputs: list[np.ndarray | None], *, opset: int, n_outputs: int = 1,
          rtol: float = 1e-6, atol: float = 0.0, **attrs) -> tuple[np.ndarray, ...]:
    """run_both + assert_same; returns our outputs for extra assertions."""
    ours, ref = run_both(op_type, inputs, opset=opset, n_outputs=n_outputs, **attrs)
    assert_same(ours, ref, rtol=rtol, atol=atol)
    return ours


def check_ort(op_type: str, inputs: list[np.ndarray | None], *, opset: int, n_outputs: int = 1,
              out_elem: int | list[int] | None = None, rtol: float = 1e-3, atol: float = 1e-4,
              **attrs) -> tuple[np.ndarray, ...]:
    """Our fast kernel against onnxruntime (the project's definition of correct); returns our outputs.

    Floats within ``atol`` + ``rtol`` (default: the project's 1e-4 + 1e-3), integers exactly.
    """
    ours = run_ours(op_type, inputs, opset=opset, n_outputs=n_outputs, **attrs)
    ref = run_ort(op_type, inputs, opset=opset, n_outputs=n_outputs, out_elem=out_elem, **attrs)
    assert_same(ours, ref, rtol=rtol, atol=atol)
    return ours
