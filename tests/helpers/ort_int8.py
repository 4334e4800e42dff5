"""Where onnxruntime's int8 GEMM is not the ONNX spec's exact int32 product, and an exact stand-in.

MLAS's U8S8 GEMM on CPUs without VNNI (AVX2, AVX-512BW) multiplies with ``vpmaddubsw``, which sums
each pair of u8*s8 products into a saturating int16: with full-range operands (255*127*2 = 64,770)
``MatMulInteger`` then comes out wrong, as onnxruntime's quantization docs warn ("saturation issue",
``reduce_range``). On such a CPU the tests compare our exact results with an exact reference instead:
the same model on onnxruntime with every ``MatMulInteger`` rewritten as int32 ``Sub``/``MatMul``, so
everything else (DynamicQuantizeLinear's rounding, the rescale) is still onnxruntime's own.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
from onnx import TensorProto, helper


@functools.cache
def ort_u8s8_saturates() -> bool:
    """True when onnxruntime's u8 x s8 ``MatMulInteger`` sums pairs in int16 on this CPU (probed, not guessed)."""
    import onnxruntime as ort

    k = 64
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [k, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a, b = np.full((4, k), 255, np.uint8), np.full((k, 4), 127, np.int8)
    (y,) = s.run(None, {"a": a, "b": b})
    return int(y[0, 0]) != 255 * 127 * k


def saturated_u8s8(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What MLAS's ``vpmaddubsw`` kernel gives for u8 ``a`` @ s8 ``b`` (no zero points): int16-saturated pairs."""
    p = a.astype(np.int64)[..., :, None] * b.astype(np.int64)
    if p.shape[-2] % 2:
        p = np.concatenate([p, np.zeros_like(p[..., :1, :])], axis=-2)
    return np.clip(p[..., 0::2, :] + p[..., 1::2, :], -32768, 32767).sum(-2).astype(np.int32)


def exact_matmul_integer_model(path: str) -> str:
    """A copy of ``path`` (next to it) whose ``MatMulInteger`` nodes are exact int32 ``Sub`` + ``MatMul``."""
    out = path[:-5] + ".exact_int.onnx"
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(path):
        return out
    m = onnx.load(path)
    nodes = []
    for idx, n in enumerate(m.graph.node):
        if n.op_type != "MatMulInteger":
            nodes.append(n)
            continue
        tag = f"__mmi{idx}"  # node names may be empty or repeated: the index keeps new names unique
        ins = list(n.input) + [""] * (4 - len(n.input))
        operands = []
        for side, (x, zp) in enumerate(((ins[0], ins[2]), (ins[1], ins[3]))):
            x32 = f"{tag}_x{side}_i32"
            nodes.append(helper.make_node("Cast", [x], [x32], to=TensorProto.INT32))
            if zp:
                zp32 = f"{tag}_zp{side}_i32"
                nodes.append(helper.make_node("Cast", [zp], [zp32], to=TensorProto.INT32))
                if side == 0:  # a's zero point may be per row (1-D over M): broadcast it as a column
                    col = f"{tag}_zp0_col"
                    nodes.append(helper.make_node("Unsqueeze", [zp32, f"{tag}_minus1"], [col]))
                    m.graph.initializer.append(helper.make_tensor(f"{tag}_minus1", TensorProto.INT64, [1], [-1]))
                    zp32 = col
                d = f"{tag}_x{side}_centered"
                nodes.append(helper.make_node("Sub", [x32, zp32], [d]))
                x32 = d
            operands.append(x32)
        nodes.append(helper.make_node("MatMul", operands, list(n.output), name=n.name))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, out)
    return out
