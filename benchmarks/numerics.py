"""Numerics of a whole INT4 LLM against onnxruntime: how far the outputs are apart, and which ops are bit-exact.

At ``accuracy_level`` 4 both runtimes quantize MatMulNBits activations to int8 per block, so a one-ulp
difference upstream that lands on a rounding boundary moves a value by a whole int8 step, and deep models
amplify it. This script shows where that happens:

- ``whole``: every output of one prefill, ours vs onnxruntime: max abs difference, elements outside
  atol 1e-4 + rtol 1e-3, and whether our first and second runs are bit-identical; per layer for the
  ``present.*`` outputs (where the divergence starts);
- ``decode`` (``--decode N``): N decode steps after the prefill, each fed onnxruntime's previous outputs
  (its greedy token and presents), so every step is compared on its own: logits max abs difference,
  elements outside the tolerance, outputs not bit-identical;
- ``ops``: every float-producing node of the first ``--layers`` layers (and those outside the layers) run
  alone by us on onnxruntime's own inputs (its intermediate values), compared bit for bit with
  onnxruntime's output of that node: per op type, nodes, bit-exact nodes, max abs difference.

No timing. Models come from the folder ``benchmarks/llm.py`` uses.

    python -m benchmarks.numerics [--models medium] [--levels 4,0] [--prompt 16] [--decode 0] [--layers 3] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections import defaultdict

if __package__:  # python -m benchmarks.NAME
    from benchmarks import _common as C
    from benchmarks import llm as L
else:  # python benchmarks/NAME.py
    import _common as C
    import llm as L

ATOL, RTOL = 1e-4, 1e-3


def _diff(ref, got) -> dict:
    import numpy as np

    d = np.abs(ref.astype(np.float64) - got.astype(np.float64))
    return {"max_abs": float(d.max()) if d.size else 0.0, "max_ref": float(np.abs(ref).max()) if ref.size else 0.0,
            "outside": int((d > ATOL + RTOL * np.abs(ref)).sum()), "size": int(ref.size),
            "bit_exact": bool(np.array_equal(ref, got))}


def _layer(name: str) -> int | None:
    return int(name.split("/layers.")[1].split("/")[0]) if "/layers." in name else None


def _ort_intermediates(m, folder: str, feeds: dict) -> dict:
    """Every node output of ``m`` as onnxruntime computes it (a copy with all of them as graph outputs,
    saved beside the model so that its external data resolves, removed afterwards)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    have = {o.name for o in m2.graph.output}
    for n in m2.graph.node:
        for o in n.output:
            if o and o not in have:
                m2.graph.output.append(helper.make_empty_tensor_value_info(o))
                have.add(o)
    path = os.path.join(folder, f".numerics-{uuid.uuid4().hex}.onnx")
    try:
        onnx.save(m2, path)
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [o.name for o in s.get_outputs()]
        return {**feeds, **dict(zip(names, s.run(names, feeds)))}
    finally:
        if os.path.exists(path):
            os.remove(path)


def _ops(m, folder: str, values: dict, layers: int) -> dict:
    """Per op type: nodes, bit-exact nodes, max abs difference, the worst node (see the module docstring)."""
    import onnx
    from onnx import helper

    from onnx_prepared import InferenceSession

    inits = {t.name: t for t in m.graph.initializer}
    stats: dict = defaultdict(lambda: {"nodes": 0, "bit_exact": 0, "max_abs": 0.0, "worst": ""})
    for n in m.graph.node:
        k = _layer(n.name)
        outs = [o for o in n.output if o]
        if (k is not None and k >= layers) or n.op_type == "Constant" or not outs:
            continue
        if not all(values[o].dtype.kind == "f" for o in outs):
            continue
        g = helper.make_graph([n], "one", [], [helper.make_empty_tensor_value_info(o) for o in outs])
        feeds = {}
        for x in (x for x in n.input if x):
            if x in inits:
                g.initializer.append(inits[x])
            elif x not in feeds:
                v = values[x]
                g.input.append(helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
                feeds[x] = v
        path = os.path.join(folder, f".numerics-{uuid.uuid4().hex}.onnx")
        try:
            onnx.save(helper.make_model(g, opset_imports=m.opset_import, ir_version=m.ir_version), path)
            got = InferenceSession(path).run(outs, feeds)
        finally:
            if os.path.exists(path):
                os.remove(path)
        s = stats[n.op_type]
        for o, y in zip(outs, got):
            d = _diff(values[o], y)
            s["nodes"] += 1
            s["bit_exact"] += d["bit_exact"]
            if d["max_abs"] >= s["max_abs"]:
                s["max_abs"], s["worst"] = d["max_abs"], n.name
    return dict(stats)


def _decode_steps(ref, ours, config, names: list[str], out: dict, steps: int) -> list[dict]:
    """``steps`` decode steps from onnxruntime's outputs ``out``, each step fed onnxruntime's last ones."""
    from onnx_prepared.generate import decode_feeds

    rows = []
    for _ in range(steps):
        feeds = decode_feeds(config, int(out["logits"][0, -1].argmax()), out)
        want = dict(zip(names, ref.run(names, feeds)))
        got = dict(zip(names, ours.run(names, feeds)))
        d = _diff(want["logits"], got["logits"])
        rows.append({"past": int(feeds["past_key_values.0.key"].shape[2]), "max_abs": d["max_abs"],
                     "outside": d["outside"], "size": d["size"],
                     "not_bit_exact": [n for n in names if not _diff(want[n], got[n])["bit_exact"]]})
        out = want
    return rows


def bench_model(path: str, prompt: int, layers: int, decode: int = 0) -> dict:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from onnx_prepared.generate import TinyLlmConfig, prefill_feeds

    config = TinyLlmConfig.from_model(path)
    ids = np.random.default_rng(0).integers(0, config.vocab, (1, prompt), dtype=np.int64)
    feeds = prefill_feeds(config, ids)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    expected = dict(zip(names, ref.run(names, feeds)))
    from onnx_prepared import InferenceSession

    s = InferenceSession(path)  # outputs by name, in onnxruntime's order
    first, second = (dict(zip(names, s.run(names, feeds))) for _ in range(2))
    whole = {}
    for name in names:
        d = _diff(expected[name], first[name])
        d["first_equals_later"] = bool(np.array_equal(first[name], second[name]))
        whole[name] = d
    steps = _decode_steps(ref, s, config, names, expected, decode)
    folder = os.path.dirname(path)
    m = onnx.load(path, load_external_data=False)
    values = _ort_intermediates(m, folder, feeds)
    return {"accuracy_level": config.accuracy_level, "whole": whole, "decode": steps,
            "ops": _ops(m, folder, values, layers)}


def run(models: list[str], levels: list[int], prompt: int, layers: int, models_dir: str, decode: int = 0) -> dict:
    res: dict = {"benchmark": "numerics", "machine": C.machine(), "prompt": prompt, "layers": layers,
                 "decode": decode, "atol": ATOL, "rtol": RTOL, "rows": []}
    for model in models:
        for level in levels:
            row = bench_model(L.model_path(models_dir, model, level), prompt, layers, decode)
            res["rows"].append({"model": model, "level": level, **row})
    return res


def printer(res: dict) -> None:
    print(f"numerics vs onnxruntime, prefill {res['prompt']} tokens; tolerance atol {res['atol']} + rtol "
          f"{res['rtol']}; load avg {res['machine']['load_avg']}")
    for r in res["rows"]:
        print(f"\n{r['model']} accuracy_level {r['level']}: whole model")
        print(f"  {'output':28s} {'max abs':>10s} {'max|ref|':>9s} {'outside':>9s} {'of':>9s}  first==later")
        for name, d in r["whole"].items():
            print(f"  {name:28s} {d['max_abs']:10.3g} {d['max_ref']:9.3g} {d['outside']:9d} {d['size']:9d}  "
                  f"{d['first_equals_later']}")
        if r.get("decode"):
            print("  decode steps, each fed onnxruntime's previous outputs:")
            print(f"  {'past':>6s} {'logits max abs':>14s} {'outside':>9s} {'of':>9s}  outputs not bit-exact")
            for d in r["decode"]:
                names = d["not_bit_exact"]
                more = f" (+{len(names) - 4})" if len(names) > 4 else ""
                print(f"  {d['past']:6d} {d['max_abs']:14.3g} {d['outside']:9d} {d['size']:9d}  "
                      f"{', '.join(names[:4]) or '-'}{more}")
        print(f"  per op, first {res['layers']} layers, fed onnxruntime's own inputs:")
        print(f"  {'op':34s} {'nodes':>5s} {'bit-exact':>9s} {'max abs':>10s}  worst node")
        for op, s in sorted(r["ops"].items()):
            print(f"  {op:34s} {s['nodes']:5d} {s['bit_exact']:9d} {s['max_abs']:10.3g}  {s['worst']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=C.parse_list, default=["medium"])
    ap.add_argument("--levels", type=lambda s: [int(x) for x in C.parse_list(s)], default=[4, 0])
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--decode", type=int, default=0, help="decode steps after the prefill")
    ap.add_argument("--layers", type=int, default=3, help="per-op check over the first N layers")
    ap.add_argument("--models-dir", default=C.MODELS_DIR)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    bad = [m for m in a.models if m not in L.MODELS]
    if bad or a.prompt < 1 or a.layers < 0 or a.decode < 0:
        ap.error(f"unknown models {bad}, or non-positive prompt / negative layers or decode steps")
    C.emit(run(a.models, a.levels, a.prompt, a.layers, a.models_dir, a.decode), a.json, printer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
