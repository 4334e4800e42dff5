"""The one exception hierarchy users see.

Every user-facing error derives from :class:`OnnxPreparedError` and names what it is about (file,
tensor, node, feed). Broken internal invariants raise :class:`InternalError` instead, so a user error
type never hides a bug. :class:`Cancelled` derives from ``BaseException`` (as trio's does) so that a
broad ``except Exception`` inside a task cannot swallow a cancellation; a waiter sees
:class:`CancelledError` instead (rule W1 in ``onnx_prepared.scheduler``).
"""

from __future__ import annotations

import concurrent.futures


class OnnxPreparedError(Exception):
    """Base class of every error the package raises on bad input or failed execution."""


class ModelLoadError(OnnxPreparedError):
    """The model file cannot be read or parsed (missing file, malformed protobuf, bad graph)."""


class ExternalDataError(ModelLoadError):
    """An initializer's external data is invalid: escaping location, missing file, bad offset/length."""

    def __init__(self, message: str, *, tensor: str | None = None, file: str | None = None):
        parts = [message]
        if tensor is not None:
            parts.append(f"tensor={tensor!r}")
        if file is not None:
            parts.append(f"file={file!r}")
        super().__init__(" ".join(parts) if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})")
        self.tensor = tensor
        self.file = file


class InvalidFeedError(OnnxPreparedError, ValueError):
    """An input feed is missing, unknown, or has the wrong dtype or rank."""


class UnsupportedOpError(OnnxPreparedError):
    """No kernel (fast or fallback) exists for a node's (domain, op_type, opset)."""


class KernelError(OnnxPreparedError):
    """A kernel failed while executing a node; the message names the node, op, opset and inputs."""


class ManifestError(OnnxPreparedError):
    """A payload read was requested that the frozen payload manifest does not allow."""


class InvalidOptionError(OnnxPreparedError, ValueError):
    """A session option was given a value of the wrong type or outside its range; names both."""

    def __init__(self, option: str, value: object, allowed: str):
        super().__init__(f"SessionOptions.{option} = {value!r} is not valid: expected {allowed}")
        self.option = option
        self.allowed = allowed


class UnknownOptionError(InvalidOptionError, AttributeError):
    """A session option that neither onnxruntime nor onnx-prepared has (usually a misspelling)."""


class CacheError(OnnxPreparedError):
    """A prepared-cache entry is structurally corrupt (bad checksum, truncated, missing payload)."""


class InternalError(Exception):
    """A broken invariant inside onnx_prepared: always a bug, never the user's input."""


class Cancelled(BaseException):
    """The operation was cancelled and its effect did not happen."""


class CancelledError(concurrent.futures.CancelledError, Cancelled):
    """What a waiter sees for a cancelled submission (``wait``, ``result``, ``exception``; rule W1).

    A ``concurrent.futures.CancelledError`` (an ``Exception``: a server's ``except Exception`` contains it,
    as it would a cancelled ``Future``'s) and a :class:`Cancelled` (code written for trio-style
    cancellation still catches it).
    """
