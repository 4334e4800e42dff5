"""Write docs/cli.md from the argparse parser itself, so the CLI reference cannot drift.

    python docs/cli_reference.py           # rewrite docs/cli.md
    python docs/cli_reference.py --check   # exit 1 if docs/cli.md is out of date (the test runs this)
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, "cli.md")


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    """(full command, parser) for ``parser`` and every subcommand below it, depth first, in declared order."""
    out = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{prefix} {name}")
    return out


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix the width for a stable page
    sys.path.insert(0, os.path.dirname(HERE))
    from onnx_prepared.cli import build_parser

    parser = build_parser()
    parts = ["# Command-line reference", "",
             "Generated from the argument parser by `python docs/cli_reference.py`; "
             "`tests/docs/test_docs.py` fails when this page is out of date.", ""]
    commands = _commands(parser, "onnx-prepared")
    parts += [f"- [`{name}`](#{name.replace(' ', '-')})" for name, _ in commands[1:]]
    for name, sub in commands:
        parts += ["", f"## {name}", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        with open(PAGE, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{PAGE} is out of date: run python docs/cli_reference.py", file=sys.stderr)
                return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
