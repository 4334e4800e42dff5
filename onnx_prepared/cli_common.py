"""Shared pieces of the command line: exit codes, the usage error, argument types, message wording."""

from __future__ import annotations

import argparse
import os
import re

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command-line argument is wrong (exit 2); raised by command handlers after argparse's own checks."""


def humanize(message: str) -> str:
    """Our concepts instead of the companion's internal metadata keys (``onnx_light.*``)."""
    message = message.replace("model metadata lacks onnx_light.prepared.", "not a companion prepared model: no ")
    message = re.sub(r"onnx_light\.prepared\.(\w+)", lambda m: "companion " + m.group(1).replace("_", " "), message)
    return re.sub(r"onnx_light\.prepack\.(\w+)", lambda m: "entry " + m.group(1).replace("_", " "), message)


def existing_file(kind: str):
    """argparse ``type=``: a path that exists (else a usage error naming the argument's role)."""
    def check(value: str) -> str:
        if not os.path.exists(value):
            raise argparse.ArgumentTypeError(f"{kind} {value!r} does not exist")
        return value
    return check


def non_negative(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {n}")
    return n


def positive(value: str) -> int:
    n = non_negative(value)
    if n == 0:
        raise argparse.ArgumentTypeError("expected an integer >= 1, got 0")
    return n


def byte_size(value: str) -> int:
    from onnx_prepared.errors import InvalidOptionError
    from onnx_prepared.options import parse_bytes

    try:
        return parse_bytes(int(value) if value.isdigit() else value)
    except InvalidOptionError as e:
        raise argparse.ArgumentTypeError(str(e).replace("SessionOptions.size = ", "")) from None
