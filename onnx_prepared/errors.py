"""The one exception hierarchy users see.

Every user-facing error derives from :class:`OnnxPreparedError` and names what it is about (file,
tensor, node, feed). Broken internal invariants raise :class:`InternalError` instead, so a user error
type never hides a bug. :class:`Cancelled` derives from ``BaseException`` (as trio's does) so that a
broad ``except Exception`` inside a task cannot swallow a cancellation; a waiter sees
:class:`CancelledError` instead (rule W1 in ``onnx_prepared.scheduler``).
"""

from __future__ import annotations

import _thread

#: Longest message an error keeps; the middle of a longer one is elided (a 10 MB node name must not
#: become a 10-million-character message).
MESSAGE_LIMIT = 2000
#: Longest name (node, tensor, file, option) ``short`` lets through whole.
NAME_LIMIT = 120


def short(name: object, limit: int = NAME_LIMIT) -> str:
    """``repr``-free bounded text of a user-controlled name for messages: head ... tail, with the count."""
    s = name if isinstance(name, str) else str(name)
    if len(s) <= limit:
        return s
    keep = max(8, limit - 40)
    return f"{s[: keep // 2 + keep % 2]}...<{len(s) - keep} chars>...{s[-(keep // 2):]}"


class OnnxPreparedError(Exception):
    """Base class of every error the package raises on bad input or failed execution.

    The message is bounded (``MESSAGE_LIMIT``) whatever the names inside it.
    """

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str) and len(args[0]) > MESSAGE_LIMIT:
            args = (short(args[0], MESSAGE_LIMIT), *args[1:])
        super().__init__(*args)


class ModelLoadError(OnnxPreparedError):
    """The model file cannot be read or parsed (missing file, malformed protobuf, bad graph)."""


class ExternalDataError(ModelLoadError):
    """An initializer's external data is invalid: escaping location, missing file, bad offset/length."""

    def __init__(self, message: str, *, tensor: str | None = None, file: str | None = None):
        parts = [message]
        if tensor is not None:
            parts.append(f"tensor={short(tensor)!r}")
        if file is not None:
            parts.append(f"file={short(file, 400)!r}")
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


class MissingDependencyError(OnnxPreparedError, ImportError):
    """An optional extra is needed for this feature; the message says what to install."""


class ClosedError(OnnxPreparedError, RuntimeError):
    """A closed session (or a closed scheduler) was asked to run or prepare."""


class CacheError(OnnxPreparedError):
    """A prepared-cache entry is structurally corrupt (bad checksum, truncated, missing payload)."""


class ResourceLimitError(OnnxPreparedError, MemoryError):
    """An allocation would exceed a configured memory limit or the machine's physical memory; raised
    before anything is allocated, naming what needed the bytes."""


class CacheWarning(UserWarning):
    """The prepared cache could not be written (read-only folder, ...) and continues read-only."""


class InternalError(Exception):
    """A broken invariant inside onnx_prepared: always a bug, never the user's input."""


class Cancelled(BaseException):
    """The operation was cancelled and its effect did not happen."""


def _cancelled_error() -> type:
    """Build :class:`CancelledError` on first use.

    Its base ``concurrent.futures.CancelledError`` lives in ``concurrent.futures._base``, whose import
    pulls in ``logging`` (2.5-5 ms of every start-up); nothing before the first cancellation needs it.
    ``except`` matches on the real base classes, so the class has to subclass it, not register with it.
    """
    import concurrent.futures

    class CancelledError(concurrent.futures.CancelledError, Cancelled):
        """What a waiter sees for a cancelled submission (``wait``, ``result``, ``exception``; rule W1).

        A ``concurrent.futures.CancelledError`` (an ``Exception``: a server's ``except Exception`` contains it,
        as it would a cancelled ``Future``'s) and a :class:`Cancelled` (code written for trio-style
        cancellation still catches it).
        """

    CancelledError.__module__, CancelledError.__qualname__ = __name__, "CancelledError"
    return CancelledError


_cancelled_lock = _thread.allocate_lock()


def __getattr__(name: str) -> type:
    if name == "CancelledError":
        with _cancelled_lock:  # one class for every thread: ``except`` compares classes, not names
            cls = globals().get("CancelledError")
            if cls is None:
                cls = globals()["CancelledError"] = _cancelled_error()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
