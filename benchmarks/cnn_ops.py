"""CNN/RNN ops one node at a time, steady state: ours vs onnxruntime side by side in one process.

Each case is a single-node model on realistic shapes (ResNet-18 / MobileNetV3 convs, depthwise, 1x1, a
segmentation head's ConvTranspose, pools, BatchNormalization, Resize x2, LSTM/GRU of hidden 64-256 and
sequence 50-100, TopK/NMS of a detector head, Einsum). Weights are initializers, so our side runs the
prepacked kernels after ``prepare()`` (hot path). Sides, interleaved in rounds:

- ``ours`` / ``ours-b2``: :class:`~onnx_prepared.runtime.RuntimeSession` with ``blas_threads`` 1 (the
  default) and 2 (``intra_op_num_threads`` default);
- ``ort`` / ``ort-1t``: onnxruntime with its default intra-op pool and with one thread.

Times are medians of the repetitions, interleaved in rounds (each side's spinning worker threads are
charged to itself); ``x ort`` = ours / ort, ``x ort-1t`` = ours / ort-1t,
``b2 x ort`` = ours-b2 / ort. The load average is printed before and after (the machine may be shared).
``cpu x ort-1t`` compares process CPU time of ``ours`` and ``ort-1t`` (both single-threaded): on a
loaded machine wall time mostly measures the scheduler, CPU time what each side computes.
Goal (issue 13): ours / onnxruntime <= 1.5x.

    python benchmarks/cnn_ops.py [--cases a,b] [--repeat 20] [--sides ours,ours-b2,ort,ort-1t] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
else:  # python benchmarks/NAME.py
    import _common as C

GOAL = 1.5
SIDES = ("ours", "ours-b2", "ort", "ort-1t")


def _cases() -> dict:
    """name -> (op, {input name: shape or array} for runtime inputs, {initializer name: array}, attrs)."""
    import numpy as np

    r = np.random.default_rng(0)

    def w(*s, scale=None):
        fan = int(np.prod(s[1:])) if len(s) > 1 else s[0]
        return (r.standard_normal(s) * (scale or 1 / np.sqrt(fan))).astype(np.float32)

    def x(*s):
        return r.standard_normal(s).astype(np.float32)

    def conv(xs, ws, **attrs):
        return "Conv", {"X": x(*xs)}, {"W": w(*ws), "B": w(ws[0], scale=0.1)}, attrs

    def rnn(op, seq, inp, hidden, direction="forward", batch=1):
        g = {"LSTM": 4, "GRU": 3}[op]
        nd = 2 if direction == "bidirectional" else 1
        inits = {"W": w(nd, g * hidden, inp), "R": w(nd, g * hidden, hidden), "B": w(nd, 2 * g * hidden, scale=0.1)}
        return op, {"X": x(seq, batch, inp)}, inits, {"hidden_size": hidden, "direction": direction}

    bn = {n: w(64, scale=0.5) for n in ("scale", "B", "mean")}
    bn["var"] = (np.abs(w(64, scale=0.5)) + 0.5).astype(np.float32)
    boxes = np.concatenate([r.uniform(0, 600, (1, 1000, 2)), r.uniform(0, 600, (1, 1000, 2)) + 20], -1)
    return {
        "resnet_stem_7x7s2": conv((1, 3, 224, 224), (64, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3]),
        "resnet_3x3_64@56": conv((1, 64, 56, 56), (64, 64, 3, 3), pads=[1, 1, 1, 1]),
        "resnet_3x3s2_128@28": conv((1, 128, 28, 28), (256, 128, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
        "resnet_3x3_512@7": conv((1, 512, 7, 7), (512, 512, 3, 3), pads=[1, 1, 1, 1]),
        "resnet_1x1s2_64@56": conv((1, 64, 56, 56), (128, 64, 1, 1), strides=[2, 2]),
        "mbv3_stem_3x3s2": conv((1, 3, 224, 224), (16, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
        "mbv3_1x1_40->240@28": conv((1, 40, 28, 28), (240, 40, 1, 1)),
        "mbv3_1x1_96->576@7": conv((1, 96, 7, 7), (576, 96, 1, 1)),
        "mbv3_dw3x3_240@28": conv((1, 240, 28, 28), (240, 1, 3, 3), pads=[1, 1, 1, 1], group=240),
        "mbv3_dw5x5s2_72@56": conv((1, 72, 56, 56), (72, 1, 5, 5), strides=[2, 2], pads=[2, 2, 2, 2], group=72),
        "mbv3_dw3x3_16@112": conv((1, 16, 112, 112), (16, 1, 3, 3), pads=[1, 1, 1, 1], group=16),
        "seg_convT_4x4s2_128@28": ("ConvTranspose", {"X": x(1, 128, 28, 28)}, {"W": w(128, 64, 4, 4)},
                                   {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
        "maxpool_3x3s2_64@112": ("MaxPool", {"X": x(1, 64, 112, 112)}, {},
                                 {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        "avgpool_3x3_64@56": ("AveragePool", {"X": x(1, 64, 56, 56)}, {},
                              {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        "globalavgpool_512@7": ("GlobalAveragePool", {"X": x(1, 512, 7, 7)}, {}, {}),
        "batchnorm_64@112": ("BatchNormalization", {"X": x(1, 64, 112, 112)}, bn, {"epsilon": 1e-5}),
        "instancenorm_64@56": ("InstanceNormalization", {"X": x(1, 64, 56, 56)},
                               {"scale": bn["scale"], "B": bn["B"]}, {}),
        "resize_nearest_x2_64@56": ("Resize", {"X": x(1, 64, 56, 56)},
                                    {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
                                    {"mode": "nearest"}),
        "resize_linear_x2_64@56": ("Resize", {"X": x(1, 64, 56, 56)},
                                   {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
                                   {"mode": "linear"}),
        "lstm_h128_seq100": rnn("LSTM", 100, 64, 128),
        "lstm_bi_h64_seq50": rnn("LSTM", 50, 64, 64, "bidirectional"),
        "lstm_h256_seq50": rnn("LSTM", 50, 128, 256),
        "gru_h256_seq50": rnn("GRU", 50, 128, 256),
        "gru_bi_h64_seq100": rnn("GRU", 100, 40, 64, "bidirectional"),
        "pad_reflect_64@56": ("Pad", {"X": x(1, 64, 56, 56)}, {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)},
                              {"mode": "reflect"}),
        "topk_300_of_8400": ("TopK", {"X": x(1, 8400)}, {"K": np.array([300], np.int64)}, {}),
        "nms_1000_boxes": ("NonMaxSuppression", {"boxes": boxes.astype(np.float32), "scores": x(1, 1, 1000)},
                           {"max": np.array([100], np.int64), "iou": np.array([0.5], np.float32),
                            "score": np.array([0.0], np.float32)}, {}),
        "einsum_bhqd,bhkd_8x128x64": ("Einsum", {"Q": x(1, 8, 128, 64), "K": x(1, 8, 128, 64)}, {},
                                      {"equation": "bhqd,bhkd->bhqk"}),
    }


_INPUT_ORDER = {
    "Conv": ["X", "W", "B"], "ConvTranspose": ["X", "W"], "BatchNormalization": ["X", "scale", "B", "mean", "var"],
    "InstanceNormalization": ["X", "scale", "B"], "Resize": ["X", "roi", "scales"], "LSTM": ["X", "W", "R", "B"],
    "GRU": ["X", "W", "R", "B"], "Pad": ["X", "pads"], "TopK": ["X", "K"],
    "NonMaxSuppression": ["boxes", "scores", "max", "iou", "score"], "Einsum": ["Q", "K"],
}


def build(folder: str, name: str, case) -> tuple[str, dict]:
    import onnx
    from onnx import helper, numpy_helper

    op, feeds, inits, attrs = case
    order = _INPUT_ORDER.get(op, ["X"])
    n_out = {"LSTM": 3, "GRU": 2, "TopK": 2}.get(op, 1)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, order, outs, **attrs)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    path = os.path.join(folder, f"{name.replace('@', '_').replace(',', '_').replace('>', '')}.onnx")
    onnx.save(model, path)
    return path, feeds


def _sessions(path: str, sides: list[str]) -> dict:
    import onnxruntime as ort

    from onnx_prepared.runtime import RuntimeSession

    out = {}
    for side in sides:
        if side.startswith("ours"):
            s = RuntimeSession(path, {"blas_threads": 2 if side == "ours-b2" else 1})
            s.prepare()
            out[side] = s
        else:
            so = ort.SessionOptions()
            if side == "ort-1t":
                so.intra_op_num_threads = 1
            out[side] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return out


def _runner(side: str, sess, feeds: dict):
    if side.startswith("ours"):
        return lambda: sess.run(feeds)
    return lambda: sess.run(None, feeds)


def measure(name: str, path: str, feeds: dict, sides: list[str], repeat: int) -> dict:
    import numpy as np

    sessions = _sessions(path, sides)
    runners = {s: _runner(s, sessions[s], feeds) for s in sides}
    outs = {s: runners[s]() for s in sides}  # warm-up and agreement
    ref = outs.get("ort", outs.get("ort-1t"))
    agree = None
    if ref is not None and "ours" in outs:
        agree = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                    if np.size(a) else 0.0 for a, b in zip(outs["ours"], ref))
    # NOTE: rounds of several calls per side, each after one untimed call, not call-by-call alternation:
    # onnxruntime's (and OpenBLAS's) worker threads spin after a call and would be charged to the next side.
    times: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    rounds = 5
    per = max(1, repeat // rounds)
    for i in range(rounds):
        for side in C.rotate(sides, i):
            runners[side]()
            for _ in range(per):
                c0, t0 = time.process_time(), time.perf_counter()
                runners[side]()
                times[side].append(time.perf_counter() - t0)
                cpu[side].append(time.process_time() - c0)
    for s in sessions.values():
        close = getattr(s, "close", None)
        if close is not None:
            close()
    row = {"case": name, "max_abs_diff": agree}
    for s in sides:
        row[f"{s}_ms"] = C.median(times[s]) * 1e3
        row[f"{s}_cpu_ms"] = C.median(cpu[s]) * 1e3
    if "ours" in sides and "ort-1t" in sides:
        row["cpu_x_ort_1t"] = row["ours_cpu_ms"] / row["ort-1t_cpu_ms"]
    if "ours" in sides and "ort" in sides:
        row["x_ort"] = row["ours_ms"] / row["ort_ms"]
    if "ours" in sides and "ort-1t" in sides:
        row["x_ort_1t"] = row["ours_ms"] / row["ort-1t_ms"]
    if "ours-b2" in sides and "ort" in sides:
        row["b2_x_ort"] = row["ours-b2_ms"] / row["ort_ms"]
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = _cases()
    names = C.parse_list(args.cases) or list(cases)
    unknown = sorted(set(names) - set(cases))
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {', '.join(cases)}")
    sides = C.parse_list(args.sides)
    result = {"machine_before": C.machine(), "goal": GOAL, "sides": sides, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path, feeds = build(tmp, name, cases[name])
            result["rows"].append(measure(name, path, feeds, sides, args.repeat))
    result["machine_after"] = C.machine()
    C.emit(result, args.json, _print)
    return result


def _print(result: dict) -> None:
    cols = [("case", "case", "")] + [(f"{s} ms", f"{s}_ms", ".3f") for s in result["sides"]]
    cols += [("x ort", "x_ort", ".2f"), ("x ort-1t", "x_ort_1t", ".2f"), ("b2 x ort", "b2_x_ort", ".2f"),
             ("cpu x ort-1t", "cpu_x_ort_1t", ".2f"), ("max |diff|", "max_abs_diff", ".1e")]
    before = result["machine_before"]
    print(f"load average before: {before['load_avg']}  (cpus {before['cpu_count']})")
    print(C.table(result["rows"], cols))
    print(f"load average after: {result['machine_after']['load_avg']}; goal: ours / onnxruntime <= {result['goal']}x")


if __name__ == "__main__":
    main(sys.argv[1:])
