"""``onnx-prepared demo``: generate the default model into a cache folder if absent, then run it."""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnx-prepared")


def _make_mlp(folder: str) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    path = os.path.join(folder, "mlp.onnx")
    if os.path.exists(path):
        return path
    os.makedirs(folder, exist_ok=True)
    nodes, inits, prev = [], [], "x"
    for i in range(4):
        w = rng.standard_normal((256, 256)).astype(np.float32) / 16
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}"], [f"h{i}"], transB=1))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        prev = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 256])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path, save_as_external_data=True, location="mlp.data", size_threshold=0)
    return path


def run_demo(args: argparse.Namespace) -> int:
    from onnx_prepared import InferenceSession

    folder = args.dir or os.path.join(default_cache_dir(), "demo")
    path = _make_mlp(folder)
    t0 = time.perf_counter()
    sess = InferenceSession(path)
    x = np.ones((8, 256), dtype=np.float32)
    (y,) = sess.run(None, {"x": x})
    t1 = time.perf_counter()
    print(f"model: {path}")
    print(f"time to first output: {(t1 - t0) * 1e3:.1f} ms; output {y.dtype} {list(y.shape)} sum={float(y.sum()):.4f}")
    return 0
