"""Deterministic model generators; today the spec's tiny INT4 LLM (the project's benchmark model).

>>> from onnx_prepared.generate import generate_tiny_llm
>>> path = generate_tiny_llm("/tmp/tiny-llm")                     # doctest: +SKIP
>>> path = generate_tiny_llm("/tmp/medium-llm", preset="medium")  # doctest: +SKIP

CLI (hooked into ``onnx-prepared`` by :func:`add_generate_parser`)::

    onnx-prepared generate tiny-llm OUT_DIR [--preset tiny|medium|large] [--embedding tied|fp32] [--layers N] ...
"""

from __future__ import annotations

import argparse
import os
import sys

from onnx_prepared.generate.config import EMBEDDINGS, PRESETS, TinyLlmConfig
from onnx_prepared.lazy import lazy_attributes

# The generator and its checker (onnx.helper, onnx.checker) load on first use, so the CLI's start and
# --help stay light.
_LAZY = {
    "check_model": "checker", "decode_feeds": "feeds", "empty_past": "feeds", "prefill_feeds": "feeds",
    **dict.fromkeys(("DATA_FILE", "MODEL_FILE", "generate_tiny_llm", "timed_generate", "weight_names"), "tiny_llm"),
}


__getattr__ = lazy_attributes(__name__, globals(), _LAZY)

__all__ = [
    "DATA_FILE",
    "MODEL_FILE",
    "PRESETS",
    "TinyLlmConfig",
    "add_generate_parser",
    "check_model",
    "decode_feeds",
    "empty_past",
    "generate_tiny_llm",
    "prefill_feeds",
    "weight_names",
]

_DIM_OPTIONS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "seed", "block_size",
                "context_length", "accuracy_level")


def add_generate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``generate`` (with its ``tiny-llm`` model) to an ``add_subparsers()`` object; returns the parser.

    The handler is stored as ``fn`` (``args.fn(args)`` -> exit code), like the other CLI commands.
    """
    gen = subparsers.add_parser("generate", help="write a deterministic synthetic model")
    models = gen.add_subparsers(dest="model", required=True)
    t = models.add_parser("tiny-llm", help="the spec's tiny INT4 LLM (genai layout, MatMulNBits, GQA, KV-cache)",
                          description="Write OUT_DIR/tiny-llm.onnx, tiny-llm.data (4096-aligned, sha256 per tensor) "
                                      "and genai_config.json. Same arguments give byte-identical files.")
    t.add_argument("out_dir", metavar="OUT_DIR", help="folder for the three files (created if missing)")
    t.add_argument("--preset", choices=sorted(PRESETS), default=None, help="base dimensions (default: tiny)")
    for name in _DIM_OPTIONS:
        t.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None,
                       help=f"override the preset (tiny: {getattr(PRESETS['tiny'], name)})")
    t.add_argument("--embedding", choices=EMBEDDINGS, default=None,
                   help="tied (default): the INT4 LM head doubles as the embedding; fp32: genai's builder default, "
                        "an untied float32 embedding table and a separate INT4 LM head")
    t.set_defaults(fn=_cmd_tiny_llm)
    return gen


def _cmd_tiny_llm(args: argparse.Namespace) -> int:
    try:
        config = TinyLlmConfig.from_preset(args.preset, embedding=getattr(args, "embedding", None),
                                           **{k: getattr(args, k) for k in _DIM_OPTIONS})
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from onnx_prepared.generate.tiny_llm import DATA_FILE, timed_generate
    from onnx_prepared.progress import reporter

    path, seconds = timed_generate(config, args.out_dir, reporter(True, config.layers, "generate", unit="block"))
    data = os.path.join(os.path.dirname(path), DATA_FILE)
    c = config
    print(f"model: {path}")
    print(f"data:  {data} ({os.path.getsize(data):,} bytes)")
    print(f"config: layers={c.layers} hidden={c.hidden} intermediate={c.intermediate} heads={c.heads} "
          f"kv_heads={c.kv_heads} vocab={c.vocab} block_size={c.block_size} seed={c.seed} embedding={c.embedding}")
    print(f"parameters: {c.num_parameters:,} ({'tied' if c.tied else 'untied fp32'} embedding); "
          f"INT4+scales {c.int4_bytes:,} bytes; generated in {seconds:.2f} s")
    return 0
