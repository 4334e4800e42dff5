"""The first node whose output differs between onnx_prepared and onnxruntime.

    python tools/first_divergence.py MODEL.onnx FEEDS.npz [--atol 1e-5] [--rtol 1e-4]

Every node output of the top-level graph becomes a graph output; both runtimes run the copy
(onnxruntime with its graph optimizations off, so its node outputs are the model's), and the outputs
are compared in node order: integers exactly, floats within ``atol + rtol * max|onnxruntime|``. Prints
the first node outside that, its inputs' leading values in both runtimes, and the size of the
difference. Why: a whole-model mismatch of a quantized model (one element a quantum apart after a
DynamicQuantizeLinear) starts where an upstream float op is a few ulp apart; this finds that op.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("feeds", help=".npz with one array per graph input")
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args(argv)
    import onnxruntime as ort

    import onnx_prepared

    feeds = dict(np.load(a.feeds))
    m = onnx.load(a.model)
    names = [o for n in m.graph.node for o in n.output if o]
    declared = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=o) for o in names if o not in declared)
    producer = {o: n for n in m.graph.node for o in n.output}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "all_outputs.onnx")
        onnx.save(m, path, save_as_external_data=m.ByteSize() > (1 << 30))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 4
        ref_sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ref = dict(zip([o.name for o in ref_sess.get_outputs()], ref_sess.run(None, feeds)))
        ours_sess = onnx_prepared.InferenceSession(path)
        got = dict(zip([o.name for o in ours_sess.get_outputs()], ours_sess.run(None, feeds)))
    for o in names:
        x, y = np.asarray(got[o]), np.asarray(ref[o])
        n = producer[o]
        if x.shape != y.shape:
            print(f"{n.op_type} {n.name!r} output {o!r}: shape {x.shape} against onnxruntime's {y.shape}")
            return 1
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        bound = 0.0 if y.dtype.kind in "iub" else a.atol + a.rtol * float(np.max(np.abs(y), initial=0.0))
        if d.size and float(np.nanmax(d)) > bound:
            print(f"first divergence: {n.op_type} {n.name!r} output {o!r} ({x.dtype}): max |diff| "
                  f"{float(np.nanmax(d)):.3g}, {int((d > bound).sum())} of {d.size} elements")
            for i in n.input:
                if i in got:
                    print(f"  input {i!r}: ours {np.ravel(got[i])[:6]}  onnxruntime {np.ravel(ref[i])[:6]}")
            return 1
    print(f"no divergence over {len(names)} node outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
