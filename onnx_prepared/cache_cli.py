"""``onnx-prepared cache build | verify | gc | info``: build, check, clean and describe a companion prepared model.

Hooked into ``cli.py`` with ``add_cache_parser(subparsers)``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from onnx_prepared.cli_common import existing_file, humanize
from onnx_prepared.errors import CacheError


def cmd_cache_build(args: argparse.Namespace) -> int:
    """Prepare every object of MODEL eagerly and persist the packed ones (build_if_missing)."""
    from onnx_prepared.prepared.cache import default_prepared_path, info
    from onnx_prepared.runtime import RuntimeSession

    out = args.out or default_prepared_path(args.model)
    sess = RuntimeSession(args.model, {"prepared_model_policy": "build_if_missing", "prepared_model_path": out})
    try:
        sess.prepare(progress=not args.quiet)  # waits for the persists too, and flushes
        degraded = sess.companion.degraded if sess.companion is not None else None
    finally:
        sess.close()
    if degraded is not None:
        raise CacheError(f"cannot build {out}: {degraded} (the cache folder is not writable; pass --out)")
    summary = info(out)
    print(f"{out}: {summary['entries']} entries, {summary['total_bytes']:,d} bytes "
          f"(generation {summary['generation']}, kernel ABI {summary['kernel_abi']})")
    return 0


def cmd_cache_verify(args: argparse.Namespace) -> int:
    """Check every entry (metadata, files, checksums); exit 1 on any problem."""
    from onnx_prepared.prepared.cache import source_model_digest, verify

    digest = source_model_digest(args.model) if args.model else None
    problems = verify(args.path, source_digest=digest)
    for p in problems:
        print(humanize(p))
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.path}: OK")
    return 0


def cmd_cache_gc(args: argparse.Namespace) -> int:
    """Drop superseded-layout entries, compact mostly-dead data files, remove unreferenced data files and dead
    writers' temporary files of a companion (safe while others write)."""
    from onnx_prepared.prepared.cache import collect_garbage

    dropped: list[str] = []
    removed = collect_garbage(args.path, dropped=dropped)
    for name in dropped:
        print(f"dropped entry {name}")
    for name in removed:
        print(f"removed {name}")
    print(f"{args.path}: {len(removed)} file(s) removed, {len(dropped)} stale entries dropped")
    return 0


def cmd_cache_info(args: argparse.Namespace) -> int:
    """Entries, bytes, layouts, devices, kernel ABI and source digest of a companion (metadata only)."""
    from onnx_prepared.prepared.cache import info

    summary = info(args.path)
    if summary["format_version"] is None:
        raise CacheError(f"{args.path} is not a companion prepared model (it has no prepared-format metadata); "
                         "`onnx-prepared cache build MODEL` makes one")
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    print(f"companion: {summary['path']}")
    print(f"format version: {summary['format_version']}   generation: {summary['generation']}")
    print(f"source model digest: {summary['source_model_digest']}")
    print(f"kernel ABI (writer): {summary['kernel_abi']}")
    print(f"entries: {summary['entries']}   payload bytes: {summary['total_bytes']:,d}   "
          f"source digests: {summary['source_digests']}")
    for title, key in (("layouts", "layouts"), ("devices", "devices"), ("kernel ABIs", "kernel_abis")):
        print(f"{title}: " + ", ".join(f"{k} x{v}" for k, v in sorted(summary[key].items())))
    for f, size in summary["data_files"].items():
        print(f"  data file {f}: {'missing' if size is None else f'{size:,d} bytes'}")
    if args.entries:
        for e in summary["entry_list"]:
            print(f"  {e['bytes']:14,d}  {e['name']}  ({e['device']}, {e['kernel_abi']}, {e['file']}@{e['offset']})")
    for p in summary["problems"]:
        print(f"problem: {humanize(p)}")
    return 1 if summary["problems"] else 0


def add_cache_parser(subparsers: Any) -> None:
    """Register ``cache build|verify|gc|info`` on the CLI's subparsers (each sets ``fn``)."""
    c = subparsers.add_parser("cache", help="build, verify or describe a companion prepared model")
    sub = c.add_subparsers(dest="cache_cmd", required=True)
    b = sub.add_parser("build", help="prepare MODEL eagerly and persist its packed weights")
    b.add_argument("model", type=existing_file("model"), help="the .onnx file to prepare")
    b.add_argument("--out", default=None, help="companion path (default: the per-user cache folder)")
    b.add_argument("--quiet", action="store_true", help="no progress bar (there is none unless stderr is a "
                                                        "terminal)")
    b.set_defaults(fn=cmd_cache_build)
    v = sub.add_parser("verify", help="check every entry's metadata, files and checksums (exit 1 on a problem)")
    v.add_argument("path", type=existing_file("companion"), help="the companion prepared model (.onnx)")
    v.add_argument("--model", type=existing_file("model"), default=None,
                   help="also check the companion belongs to this source model")
    v.set_defaults(fn=cmd_cache_verify)
    g = sub.add_parser("gc", help="drop superseded-layout entries, compact, remove unreferenced data files "
                                  "and orphaned temporary files")
    g.add_argument("path", help="the companion prepared model (.onnx); need not exist (orphans are removed)")
    g.set_defaults(fn=cmd_cache_gc)
    i = sub.add_parser("info", help="entries, bytes, layouts, devices, kernel ABI (metadata only; exit 1 on a "
                                    "problem)")
    i.add_argument("path", type=existing_file("companion"), help="the companion prepared model (.onnx)")
    i.add_argument("--entries", action="store_true", help="list every entry")
    i.add_argument("--json", action="store_true", help="one JSON object")
    i.set_defaults(fn=cmd_cache_info)
