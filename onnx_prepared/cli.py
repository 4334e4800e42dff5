"""onnx-prepared: run, inspect and prepare ONNX models with fast cold start.

Commands: demo, run, inspect, generate, generate-text, bench, cache (build, verify, gc, info).
Exit codes: 0 success; 1 failure (a model that cannot load or run, a cache with problems);
2 usage (a bad or missing argument, a file that does not exist). Errors print one line;
--debug prints the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from typing import Any

from onnx_prepared.cli_common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    byte_size,
    existing_file,
    humanize,
    non_negative,
    positive,
)

# **** run ****


def load_feeds(path: str, inputs: list[Any]) -> dict[str, Any]:
    """Arrays of an ``.npz`` (keys = input names; ``arr_0, arr_1, ...`` = inputs in order) or one ``.npy``."""
    import zipfile

    import numpy as np

    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise UsageError(f"--feeds {path}: not a NumPy .npz or .npy file") from e
    if isinstance(z, np.ndarray):
        if len(inputs) != 1:
            raise UsageError(f"--feeds {path}: one .npy array, but the model has {len(inputs)} inputs; use an .npz")
        return {inputs[0].name: z}
    with z:
        arrays = {k: z[k] for k in z.files}
    names = [i.name for i in inputs]
    if arrays and all(re.fullmatch(r"arr_\d+", k) for k in arrays) and not set(arrays) & set(names):
        if len(arrays) != len(names):
            raise UsageError(f"--feeds {path}: {len(arrays)} positional arrays for {len(names)} inputs")
        return {names[int(k[4:])]: v for k, v in arrays.items()}
    unknown, missing = sorted(set(arrays) - set(names)), [n for n in names if n not in arrays]
    if unknown or missing:
        want = ", ".join(f"{i.name} ({i.type} {i.shape})" for i in inputs) or "none"
        raise UsageError(f"--feeds {path}: " + "; ".join(
            ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
            + ([f"missing input(s) {', '.join(missing)}"] if missing else [])) + f". The model's inputs: {want}")
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from onnx_prepared import InferenceSession, SessionOptions

    so = SessionOptions()
    if args.cache or args.policy:
        so.prepared_model_policy = args.policy or "build_if_missing"
        so.prepared_model_path = args.cache
    if args.memory_limit:
        so.prepared_memory_limit = args.memory_limit
    t0 = time.perf_counter()
    sess = InferenceSession(args.model, so)
    t1 = time.perf_counter()
    inputs = sess.get_inputs()
    if args.feeds is None and inputs:
        raise UsageError("--feeds is required: the model's inputs are "
                         + ", ".join(f"{i.name} ({i.type} {i.shape})" for i in inputs))
    feeds = load_feeds(args.feeds, inputs) if args.feeds else {}
    from onnx_prepared.progress import reporter

    rt = sess.runtime
    t = time.perf_counter()
    handle = rt.run_async(feeds)  # the first run streams weights in: a bar of prepared objects on a terminal
    report = reporter(True, len(rt.plan.requirements), "first run")
    if report is not None:
        rt.wait_reporting(handle, report)
    outs = handle.result()
    times = [time.perf_counter() - t]
    for _ in range(args.repeat - 1):
        t = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    names = [o.name for o in sess.get_outputs()]
    if args.out:
        np.savez(args.out, **dict(zip(names, outs)))
    for n, v in zip(names, outs):
        print(f"{n}: {getattr(v, 'dtype', type(v).__name__)} {list(getattr(v, 'shape', []))}")
        if args.print:
            with np.printoptions(threshold=args.print, edgeitems=3, precision=5, suppress=True):
                print("  " + str(np.asarray(v)).replace("\n", "\n  "))
    line = f"session {(t1 - t0) * 1e3:.1f} ms, first run {times[0] * 1e3:.1f} ms"
    if len(times) > 1:
        line += f", steady run {sorted(times[1:])[len(times[1:]) // 2] * 1e3:.2f} ms (median of {len(times) - 1})"
    policy = so.prepared_model_policy
    store = sess.runtime.companion
    print(line + (f"; prepared cache {policy}: {store.path}" if store is not None else ""), file=sys.stderr)
    if args.out:
        print(f"outputs written to {args.out}", file=sys.stderr)
    sess.runtime.close()
    return EXIT_OK


# **** inspect ****


def plan_table(plan: Any, width: int = 100) -> str:
    """The plan's tasks in ``width`` columns: a task per block, names never cut (``--wide``: one row each)."""
    import textwrap

    lines = []
    for t in plan.tasks:
        head = f"{t.id}  [{t.scope.value}, {t.resource}]"
        lines += textwrap.wrap(head, width, break_on_hyphens=False, subsequent_indent="    ")
        for label, text in (("after", ", ".join(t.dependencies)), ("result", str(t.result))):
            if text:
                lines += textwrap.wrap(text, width, break_on_hyphens=False, initial_indent=f"    {label:<7}",
                                       subsequent_indent=" " * 11)
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    from onnx_prepared.model import load_model
    from onnx_prepared.resolve import resolve_model
    from onnx_prepared.runtime.feeds import shape_of as _shape
    from onnx_prepared.runtime.feeds import type_string as _type_string

    m = load_model(args.model)
    companion = None
    if getattr(args, "cache", None):  # the plan of a session on this companion (read only): hits, dormant reads
        from onnx_prepared.prepared.cache import PreparedModelStore, source_model_digest

        companion = PreparedModelStore(args.cache, source_digest=source_model_digest(m.path, m.model),
                                       policy="read_only")
        companion.bind_sources(m.weights)
    try:
        resolved = resolve_model(m, prepared=companion, policy="read_only" if companion else "disabled")
    finally:
        if companion is not None:
            companion.close()
    if args.plan:
        from onnx_prepared.plan.prepared_plan import build_prepared_plan

        plan = build_prepared_plan(resolved)
        print(plan.table() if args.wide else plan_table(plan))
        n_s, n_i = len(plan.session_tasks), len(plan.invocation_tasks)
        print(f"\n{len(plan.tasks)} tasks: {n_s} session, {n_i} invocation; "
              f"{len(plan.execution.actions)} actions; {len(plan.requirements)} prepared requirements;\n"
              f"manifest: {len(resolved.manifest.active)} active payloads, {resolved.manifest.active_bytes:,d} bytes; "
              f"{len(resolved.dead_initializers)} dead initializers, {resolved.removed_nodes} dead nodes removed")
        for e in resolved.manifest.active.values():
            if e.rows:
                print(f"  {e.name}: {e.rows}")
        return EXIT_OK
    g = m.graph
    inits = set(m.weights)
    print(f"model: {args.model}")
    from onnx_prepared.kernels import native

    print(native.describe())
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in sorted(m.opsets.items())))
    print("inputs:")
    for i in g.input:
        if i.name not in inits:
            print(f"  {i.name}: {_type_string(i.type)} {_shape(i.type)}")
    print("outputs:")
    for o in g.output:
        print(f"  {o.name}: {_type_string(o.type)} {_shape(o.type)}")
    ops = Counter((n.domain, n.op_type) for n in g.node)
    print(f"nodes: {len(g.node)}")
    fallback = {(n.domain, n.op_type) for n, k in zip(resolved.graph().node, resolved.kernels) if k.is_fallback}
    slow = []
    for (dom, op), c in sorted(ops.items(), key=lambda kv: -kv[1]):
        fast = (dom, op) not in fallback
        if not fast:
            slow.append(f"{dom + '::' if dom else ''}{op}")
        print(f"  {c:6d}  {dom + '::' if dom else ''}{op}{'' if fast else '  (fallback)'}")
    by_file: Counter[str] = Counter()
    for w in m.weights.values():
        by_file["<inline>" if not w.is_external else w.payload.file] += w.nbytes
    print("weight bytes by file:")
    for f, b in sorted(by_file.items()):
        print(f"  {b:14,d}  {f}")
    print(f"ops without a fast kernel: {', '.join(slow) if slow else 'none'}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from onnx_prepared.demo import run_demo

    return run_demo(args)


# **** parser ****


def build_parser() -> argparse.ArgumentParser:
    from onnx_prepared.options import POLICIES

    p = argparse.ArgumentParser(prog="onnx-prepared", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="print tracebacks instead of one-line errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="generate the tiny INT4 LLM once and time a prefill and greedy decode",
                       description="Generate the spec's tiny INT4 LLM into a cache folder (once), then time session "
                                   "creation + prefill (time to first output) and greedy decode, beside onnxruntime "
                                   "when it is installed.")
    d.add_argument("--dir", default=None, help="folder for the demo model (default: ~/.cache/onnx-prepared/"
                                               "tiny-llm); a different model already there is never overwritten")
    d.add_argument("--steps", type=non_negative, default=None, help="greedy decode steps after the prefill "
                                                                    "(default 32; 0: prefill only)")
    d.add_argument("--session", choices=["runtime", "inference"], default=None,
                   help="RuntimeSession (default) or the onnxruntime-shaped InferenceSession")
    d.set_defaults(fn=cmd_demo)
    r = sub.add_parser("run", help="run MODEL once on inputs from an .npz file and show its outputs",
                       description="Run MODEL on the arrays of an .npz file and print each output's dtype and shape "
                                   "(values with --print), then session and run times on stderr.")
    r.add_argument("model", type=existing_file("model"), help="the .onnx file (external data next to it)")
    r.add_argument("--feeds", type=existing_file("feeds file"), default=None,
                   help="inputs: an .npz whose keys are the model's input names (np.savez(f, input_ids=x)), or "
                        "positional arrays arr_0, arr_1, ... in input order; or one .npy for a one-input model")
    r.add_argument("--out", default=None, help="write the outputs to this .npz, keyed by output name")
    r.add_argument("--print", type=non_negative, nargs="?", const=1000, default=0, metavar="N",
                   help="print output values (arrays over N elements, default 1000, are summarized)")
    r.add_argument("--repeat", type=positive, default=1, help="run N times; reports the median of the runs "
                                                               "after the first (steady state)")
    r.add_argument("--cache", default=None, metavar="PATH",
                   help="companion prepared model to use (policy build_if_missing unless --policy)")
    r.add_argument("--policy", choices=POLICIES, default=None,
                   help="prepared cache policy (default: disabled; with --cache: build_if_missing)")
    r.add_argument("--memory-limit", type=byte_size, default=None, metavar="SIZE",
                   help="budget for resident prepared weights, e.g. 64MiB (evicts and restores under it)")
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("inspect", help="inputs, outputs, opsets, op counts, weight bytes, fallback ops",
                       description="Describe MODEL from its metadata (no weight is read).")
    i.add_argument("model", type=existing_file("model"), help="the .onnx file")
    i.add_argument("--plan", action="store_true", help="print the prepared execution plan's tasks instead")
    i.add_argument("--wide", action="store_true", help="with --plan: one table row per task (no wrapping)")
    i.add_argument("--cache", default=None, metavar="PATH",
                   help="with --plan: the plan on this companion prepared model (read only; its hits)")
    i.set_defaults(fn=cmd_inspect)
    from onnx_prepared.bench import add_bench_parser
    from onnx_prepared.cache_cli import add_cache_parser
    from onnx_prepared.genai.cli import add_generate_text_parser
    from onnx_prepared.generate import add_generate_parser

    add_generate_parser(sub)
    add_generate_text_parser(sub)
    add_bench_parser(sub)
    add_cache_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.debug:
        return args.fn(args)
    from onnx_prepared.errors import OnnxPreparedError

    prog = " ".join(["onnx-prepared", args.cmd] + ([args.cache_cmd] if getattr(args, "cache_cmd", None) else []))
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"{prog}: error: {humanize(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # the reader (e.g. `| head`) has gone: not an error; silence the interpreter's own flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except OnnxPreparedError as e:
        print(f"{prog}: error: {humanize(str(e))}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"{prog}: error: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as e:
        print(f"{prog}: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
