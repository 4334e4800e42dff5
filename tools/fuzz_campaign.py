"""The long fuzz run: the strategies of tests/reliability/test_fuzz.py with many examples, counting outcomes.

    python tools/fuzz_campaign.py --examples 300 [--json] [--exported bn_cnn_opset9,lstm,cnn_int8_qdq]

Prints, per strategy, how many cases ran, how many gave the correct result, how many an onnx_prepared
error (by class), and every finding (foreign exception, wrong result, hang). Exit 1 on a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hypothesis import HealthCheck, given, seed, settings

from tests.reliability import fuzzing as F
from tests.reliability.bounded import Hang


def _runner(strategy, case, out: F.Outcomes, examples: int, seed_value: int):
    @seed(seed_value)  # the same --seed draws the same cases: figures in docs/reliability.md can be re-run
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(mut=strategy)
    def run(mut):
        out.counts["cases"] += 1
        try:
            case(mut, out)
        except Hang as e:
            out.counts["hang"] += 1
            out.findings.append(f"{mut!r:.200}: {e}")

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=300, help="examples per strategy")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (same seed, same cases)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--exported", default="",
                    help="comma-separated corpus models (tests/helpers/corpus.py) whose bytes to mutate too")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="fuzz-campaign-")
    base = F.make_base(os.path.join(tmp, "m"))
    companion = F.build_companion(base)
    results = {}
    strategies = {
        "model_fields": (F.model_mutation(), lambda m, o: F.run_model_case(base, os.path.join(tmp, "w1"), m, o)),
        "model_bytes": (F.bytes_mutation(),
                        lambda m, o: F.run_model_case(base, os.path.join(tmp, "w2"), m, o, as_bytes=True)),
        "companion": (F.companion_mutation(),
                      lambda m, o: F.run_companion_case(base, companion, os.path.join(tmp, "w3"), m, o)),
    }
    if a.exported:  # byte mutations of exported corpus models (needs torch), judged against onnxruntime
        from tests.helpers import corpus_cache

        folder = os.path.join(tmp, "corpus")
        os.makedirs(folder, exist_ok=True)
        def exported_case(cm, work):
            return lambda m, o: F.run_exported_case(cm.path, cm.feeds[0], work, m, o)

        for model in a.exported.split(","):
            strategies[f"exported:{model}"] = (
                F.exported_mutation(), exported_case(corpus_cache.get(folder, model), os.path.join(tmp, f"w-{model}")))
    for name, (strategy, case) in strategies.items():
        out = F.Outcomes()
        t0 = time.perf_counter()
        run = _runner(strategy, case, out, a.examples, a.seed)
        run()
        results[name] = {"counts": dict(out.counts), "findings": sorted(set(out.findings))[:50],
                         "seconds": round(time.perf_counter() - t0, 1)}
    total = Counter()
    for r in results.values():
        total.update(r["counts"])
    if a.json:
        print(json.dumps({"strategies": results, "total": dict(total), "load": os.getloadavg()}, indent=2))
    else:
        print(f"fuzz campaign: {a.examples} examples per strategy, load {os.getloadavg()}")
        for name, r in results.items():
            print(f"{name:28s} {r['seconds']:7.1f} s  " + ", ".join(f"{k}={v}" for k, v in sorted(r["counts"].items())))
            for f in r["findings"]:
                print(f"    finding: {f}")
        print("total          " + ", ".join(f"{k}={v}" for k, v in sorted(total.items())))
    return 1 if any(r["findings"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
