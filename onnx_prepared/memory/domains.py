"""The spec's four allocation domains: one enum, used by the arenas, the budget and task estimates."""

from __future__ import annotations

from enum import Enum


class Domain(str, Enum):
    """Who owns the bytes: the spec's allocation domains."""

    PREPARATION = "preparation"  # source buffers and scratch while reading / packing / hashing
    PREPARED = "prepared"  # resident prepared objects of the session
    EXECUTION = "execution"  # invocation-local intermediates and workspaces
    IO = "io"  # outputs and staged inputs crossing the runtime boundary
