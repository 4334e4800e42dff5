"""``onnx-prepared generate-text MODEL_DIR --prompt ...``: stream generated text, then TTFO and tokens/s."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from onnx_prepared.cli_common import EXIT_OK, UsageError, existing_file, non_negative, positive


def _float_in(lo: float, hi: float | None, text: str):
    """argparse ``type=``: a float in ``(lo, hi]`` (``hi`` None: unbounded), else a usage error."""
    def check(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not (lo < x and (hi is None or x <= hi)):
            raise argparse.ArgumentTypeError(f"expected a number {text}, got {x}")
        return x
    return check


_unit_float = _float_in(0.0, 1.0, "in (0, 1]")
_positive_float = _float_in(0.0, None, "> 0")


def add_generate_text_parser(subparsers: Any) -> argparse.ArgumentParser:
    g = subparsers.add_parser(
        "generate-text", help="generate text from a genai model folder (genai_config.json + tokenizer.json)",
        description="Tokenize PROMPT with the folder's tokenizer.json, generate with the decoder named by "
                    "genai_config.json (its search section gives the defaults), stream the text as tokens are "
                    "decoded, then print time to first output and decode tokens/s on stderr. Needs the "
                    "'tokenizers' library (pip install 'onnx-prepared[genai]').")
    g.add_argument("model_dir", metavar="MODEL_DIR", type=existing_file("model folder"),
                   help="a folder written by onnxruntime-genai's model builder (or the same layout)")
    g.add_argument("--prompt", required=True, help="the text to continue")
    g.add_argument("--max-tokens", type=positive, default=64, metavar="N",
                   help="new tokens at most (default 64; also capped by the model's context length)")
    g.add_argument("--temperature", type=_positive_float, default=None, help="sampling temperature (samples)")
    g.add_argument("--top-k", type=non_negative, default=None, help="sample among the K most likely tokens")
    g.add_argument("--top-p", type=_unit_float, default=None, help="sample within cumulative probability P")
    g.add_argument("--seed", type=int, default=None, help="random seed of sampling (default: unseeded)")
    g.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                   help="use (and build) the companion prepared model in the per-user cache folder, so the next "
                        "run skips prepacking (default: --cache)")
    g.set_defaults(fn=cmd_generate_text)
    return g


def cmd_generate_text(args: argparse.Namespace) -> int:
    import onnx_prepared.genai as og
    from onnx_prepared.options import SessionOptions

    t0 = time.perf_counter()
    if not os.path.isdir(args.model_dir):
        raise UsageError(f"MODEL_DIR {args.model_dir!r} is not a folder")
    so = SessionOptions(prepared_model_policy="build_if_missing" if args.cache else "disabled")
    tokenizer = og.Tokenizer(args.model_dir)  # before the model: a missing library fails at once
    model = og.Model(args.model_dir, so)
    try:
        prompt = tokenizer.encode(args.prompt)
        if prompt.size == 0:
            raise UsageError("--prompt encodes to no tokens")
        params = og.GeneratorParams(model)
        search: dict[str, Any] = {"max_length": int(prompt.size) + args.max_tokens}
        for name in ("temperature", "top_k", "top_p"):
            if getattr(args, name) is not None:
                search[name] = getattr(args, name)
                search["do_sample"] = True
        if args.seed is not None:
            search["random_seed"] = args.seed
        params.set_search_options(**search)
        generator = og.Generator(model, params)
        stream = tokenizer.create_stream()
        for t in prompt:  # the prompt is context: the first new token decodes with its leading space
            stream.decode(int(t))
        print(args.prompt, end="", flush=True)
        generator.append_tokens(prompt)
        t_first = t_last = None
        n = 0
        while not generator.is_done():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            print(stream.decode(token), end="", flush=True)
            n += 1
            t_last = time.perf_counter()
            if t_first is None:
                t_first = t_last
        print()
    finally:
        model.close()
    rate = (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else float("nan")
    store = getattr(getattr(model.session, "runtime", None), "companion", None)
    print(f"prompt {prompt.size} tokens, generated {n}; time to first output {(t_first - t0) * 1e3:.0f} ms "
          f"(model load, prefill, first token); decode {rate:.1f} tokens/s"
          + (f"; prepared cache: {store.path}" if store is not None else ""), file=sys.stderr)
    return EXIT_OK
