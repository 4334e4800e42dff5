"""MatMulNBits: our prepacked kernel vs onnxruntime on the same single-node model, side by side.

Prints a table (default) or one JSON object (``--json``). Times are medians of interleaved runs in one
process, so a loaded machine slows both sides alike; read the ratio, not the absolute time.

    python benchmarks/kernels_nbits.py [--json] [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

SHAPES = ((1024, 1024), (1024, 2816), (2816, 1024))
ROWS = (1, 128)


def _model(B, scales, K, N, block_size, accuracy_level):
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(
        "MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
        K=K, N=N, bits=4, block_size=block_size, accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "S")],
    )
    ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=ops).SerializeToString()


def _interleaved(fns: dict, repeat: int, rounds: int = 5) -> dict:
    """Median time per function; functions alternate in rounds of ``repeat // rounds`` calls.

    NOTE: not call-by-call alternation: onnxruntime's and OpenBLAS's worker threads spin after a call, and
    alternating single calls would charge each side for the other's spinning threads.
    """
    times: dict = {k: [] for k in fns}
    per = max(1, repeat // rounds)
    for _ in range(rounds):
        for k, f in fns.items():
            f()
            for _ in range(per):
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def run(repeat: int, threads: int, block_size: int = 32) -> dict:
    # numpy is imported here, after main() has set OPENBLAS_NUM_THREADS for --threads
    import numpy as np
    import onnxruntime as ort

    from onnx_prepared.kernels import matmul_nbits as mm

    rng = np.random.default_rng(0)
    rows = []
    for K, N in SHAPES:
        kb = -(-K // block_size)
        B = rng.integers(0, 256, (N, kb, block_size // 2), dtype=np.uint8)
        S = (rng.random(N * kb, dtype=np.float32) * 0.02).astype(np.float32)
        t0 = time.perf_counter()
        packed = mm.prepack_matmul_nbits(B, S, None, K=K, N=N, bits=4, block_size=block_size)
        prepack_us = (time.perf_counter() - t0) * 1e6
        sessions = {}
        for level in (0, 4):
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = threads
            sessions[level] = ort.InferenceSession(_model(B, S, K, N, block_size, level), so,
                                                   providers=["CPUExecutionProvider"])
        for M in ROWS:
            A = rng.standard_normal((M, K)).astype(np.float32)
            fns = {
                "ours": lambda A=A, p=packed: mm.matmul_nbits_packed(A, p),
                "ort_level0": lambda A=A, s=sessions[0]: s.run(None, {"A": A}),
                "ort_level4": lambda A=A, s=sessions[4]: s.run(None, {"A": A}),
            }
            t = _interleaved(fns, repeat)
            ref = sessions[0].run(None, {"A": A})[0]
            err = float(np.abs(mm.matmul_nbits_packed(A, packed)[0] - ref).max() / np.abs(ref).max())
            rows.append({
                "K": K, "N": N, "M": M, "ours_us": t["ours"], "ort_level0_us": t["ort_level0"],
                "ort_level4_us": t["ort_level4"], "ratio_vs_level0": t["ours"] / t["ort_level0"],
                "ratio_vs_level4": t["ours"] / t["ort_level4"], "prepack_us": prepack_us, "rel_err_vs_level0": err,
            })
    return {
        "cpu_count": os.cpu_count(), "threads": threads, "block_size": block_size, "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for onnxruntime and OpenBLAS (default: all cores); 1 is steadier on a loaded machine")
    args = ap.parse_args(argv)
    threads = args.threads or os.cpu_count() or 1
    if args.threads:
        # must precede OpenBLAS's initialisation, which happens when numpy is first imported by the benchmark
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    res = run(args.repeat, threads)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"cpus: {res['cpu_count']}, threads: {res['threads']}")
    print(f"{'K':>5} {'N':>5} {'M':>4} {'ours us':>9} {'ort0 us':>9} {'ort4 us':>9} {'x ort0':>7} {'x ort4':>7} "
          f"{'prepack us':>10} {'rel err':>8}")
    for r in res["rows"]:
        print(f"{r['K']:>5} {r['N']:>5} {r['M']:>4} {r['ours_us']:>9.1f} {r['ort_level0_us']:>9.1f} "
              f"{r['ort_level4_us']:>9.1f} {r['ratio_vs_level0']:>7.2f} {r['ratio_vs_level4']:>7.2f} "
              f"{r['prepack_us']:>10.0f} {r['rel_err_vs_level0']:>8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
