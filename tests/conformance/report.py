"""Pass counts of onnx's backend node tests: onnx_prepared vs onnxruntime on the same cases.

Both runtimes get the same feeds and the same comparison (``node_cases.assert_similar_outputs``); an
onnxruntime load error counts as a failure. Run from the repository root::

    python -m tests.conformance.report              # table
    python -m tests.conformance.report --json       # one JSON object
    python -m tests.conformance.report --failures   # our failing cases, `name  # reason` lines
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

if __package__ in (None, ""):  # run as a file: make `tests.conformance` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np

from tests.conformance.node_cases import RANDOM, known_failures, load_cases, run_case


class _OrtSession:
    """onnxruntime behind the same ``run(None, feeds)`` call (the model goes in serialized)."""

    def __init__(self, model):
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.log_severity_level = 4
        self._sess = onnxruntime.InferenceSession(model.SerializeToString(), opts,
                                                  providers=["CPUExecutionProvider"])

    def run(self, output_names, feeds):
        return self._sess.run(output_names, feeds)


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:160]


def evaluate(make_session, cases) -> dict[str, str | None]:
    """{case name: None if it passed, else a one-line reason}.

    Random-output cases count as failed for every runtime: their values match only by chance.
    """
    known = known_failures()
    out: dict[str, str | None] = {}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for case in cases:
            if known.get(case.name, "").startswith(RANDOM):
                out[case.name] = "random output (values not comparable)"
                continue
            try:
                run_case(make_session, case)
            except Exception as e:
                out[case.name] = _reason(e)
            else:
                out[case.name] = None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--failures", action="store_true", help="print our failures as known_failures.txt lines")
    p.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    p.add_argument("-k", default="", help="only cases whose name contains this")
    args = p.parse_args(argv)

    import onnx_prepared

    cases = [c for c in load_cases() if args.k in c.name]
    t0 = time.perf_counter()
    ours = evaluate(onnx_prepared.InferenceSession, cases)
    t1 = time.perf_counter()
    ort = None
    if not args.no_ort:
        try:
            import onnxruntime
        except ImportError:
            onnxruntime = None
        if onnxruntime is not None:
            ort = evaluate(_OrtSession, cases)
    t2 = time.perf_counter()

    ours_pass = sum(r is None for r in ours.values())
    known = known_failures()
    result = {
        "total": len(cases),
        "onnx_prepared_passed": ours_pass,
        "onnx_prepared_seconds": round(t1 - t0, 2),
        "onnxruntime_passed": None if ort is None else sum(r is None for r in ort.values()),
        "onnxruntime_version": None if ort is None else onnxruntime.__version__,
        "onnxruntime_seconds": None if ort is None else round(t2 - t1, 2),
        "both_failed": None if ort is None else sum(ours[n] is not None and ort[n] is not None for n in ours),
        "only_ours_failed": None if ort is None else sorted(n for n in ours if ours[n] and ort[n] is None),
        "only_ort_failed": None if ort is None else sum(ours[n] is None and ort[n] is not None for n in ours),
        "unlisted_failures": sorted(n for n, r in ours.items() if r is not None and n not in known),
        "listed_but_passing": sorted(n for n in known if ours.get(n, "x") is None),
    }
    if args.failures:
        for name, reason in ours.items():
            if reason is not None:
                print(f"{name}  # {known.get(name) or reason}")
        return 0
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"onnx backend node tests: {result['total']} cases")
    print(f"  onnx_prepared : {ours_pass:5d} passed  ({result['onnx_prepared_seconds']} s)")
    if ort is not None:
        print(f"  onnxruntime   : {result['onnxruntime_passed']:5d} passed  ({result['onnxruntime_seconds']} s, "
              f"onnxruntime {result['onnxruntime_version']})")
        print(f"  failed by both: {result['both_failed']}, only by onnxruntime: {result['only_ort_failed']}, "
              f"only by onnx_prepared: {len(result['only_ours_failed'])}")
    for key in ("unlisted_failures", "listed_but_passing"):
        if result[key]:
            print(f"  {key}: {', '.join(result[key])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
