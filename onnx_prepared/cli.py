"""Command line: ``onnx-prepared demo | run | inspect | generate``."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np

from onnx_prepared.errors import OnnxPreparedError


def cmd_run(args: argparse.Namespace) -> int:
    from onnx_prepared import InferenceSession

    sess = InferenceSession(args.model)
    with np.load(args.feeds, allow_pickle=False) as z:
        feeds = {k: z[k] for k in z.files}
    outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    if args.out:
        np.savez(args.out, **dict(zip(names, outs)))
    for n, v in zip(names, outs):
        print(f"{n}: {getattr(v, 'dtype', type(v).__name__)} {list(getattr(v, 'shape', []))}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from onnx_prepared.kernels import registry
    from onnx_prepared.model import load_model
    from onnx_prepared.runtime.feeds import shape_of as _shape
    from onnx_prepared.runtime.feeds import type_string as _type_string

    m = load_model(args.model)
    if args.plan:
        from onnx_prepared.plan.prepared_plan import build_prepared_plan
        from onnx_prepared.resolve import resolve_model

        resolved = resolve_model(m)
        plan = build_prepared_plan(resolved)
        print(plan.table())
        n_s, n_i = len(plan.session_tasks), len(plan.invocation_tasks)
        print(f"\n{len(plan.tasks)} tasks: {n_s} session, {n_i} invocation; "
              f"{len(plan.execution.actions)} actions; {len(plan.requirements)} prepared requirements; "
              f"manifest: {len(resolved.manifest.active)} active payloads, {resolved.manifest.active_bytes:,d} bytes; "
              f"{len(resolved.dead_initializers)} dead initializers, {resolved.removed_nodes} dead nodes removed")
        return 0
    g = m.graph
    inits = set(m.weights)
    print(f"model: {args.model}")
    opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in sorted(m.opsets.items()))
    print(f"opsets: {opsets}")
    print("inputs:")
    for i in g.input:
        if i.name not in inits:
            print(f"  {i.name}: {_type_string(i.type)} {_shape(i.type)}")
    print("outputs:")
    for o in g.output:
        print(f"  {o.name}: {_type_string(o.type)} {_shape(o.type)}")
    ops = Counter((n.domain, n.op_type) for n in g.node)
    print(f"nodes: {len(g.node)}")
    slow = []
    for (dom, op), c in sorted(ops.items(), key=lambda kv: -kv[1]):
        dom_n = registry.normalize_domain(dom)
        opset = m.opsets.get(dom_n, 1)
        fast = registry.lookup(dom_n, op, opset) is not None
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
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from onnx_prepared.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onnx-prepared", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="generate the default model if absent and run it")
    d.add_argument("--dir", default=None, help="model folder (default: a per-user cache folder)")
    d.add_argument("--steps", type=int, default=None, help="greedy decode steps (default 32)")
    d.add_argument("--session", choices=["runtime", "inference"], default=None,
                   help="RuntimeSession (default) or the onnxruntime-shaped InferenceSession")
    d.set_defaults(fn=cmd_demo)
    r = sub.add_parser("run", help="run MODEL on feeds from an .npz file")
    r.add_argument("model")
    r.add_argument("--feeds", required=True)
    r.add_argument("--out")
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("inspect", help="inputs, outputs, opsets, op counts, weight bytes, fallback ops")
    i.add_argument("model")
    i.add_argument("--plan", action="store_true", help="print the prepared execution plan as a task table")
    i.set_defaults(fn=cmd_inspect)
    from onnx_prepared.cache_cli import add_cache_parser
    from onnx_prepared.generate import add_generate_parser

    add_generate_parser(sub)
    add_cache_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except OnnxPreparedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
