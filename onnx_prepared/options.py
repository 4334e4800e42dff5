"""SessionOptions: onnxruntime's options object plus the prepared-execution settings, validated when set.

Every onnxruntime ``SessionOptions`` field has one explicit decision, listed in :data:`ORT_FIELDS`:
*honoured* (it changes what the session does) or *no effect* (accepted so onnxruntime code runs as is;
setting it to a value other than its default warns once per process with :class:`OptionIgnoredWarning`).
A value of the wrong type or range raises :class:`~onnx_prepared.errors.InvalidOptionError` naming the
option and the allowed values, at the assignment rather than at session creation.
"""

from __future__ import annotations

import enum
import os
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from onnx_prepared.errors import InvalidOptionError, UnknownOptionError


class PreparedModelPolicy(str, enum.Enum):
    """``SessionOptions.prepared_model_policy``: how a session uses the companion prepared model."""

    DISABLED = "disabled"  # never opened, never written
    READ_ONLY = "read_only"  # uses compatible entries; never creates or modifies a file
    BUILD_IF_MISSING = "build_if_missing"  # persists misses (put + flush)
    REQUIRE_COMPLETE = "require_complete"  # like read_only; plan construction fails on a miss


class EvictionPolicy(str, enum.Enum):
    """``SessionOptions.eviction_policy``: what residency does with an unpersisted victim under a budget."""

    AUTO = "auto"  # persist it to the companion (when persisting), then evict
    DROP = "drop"  # evict; a later use rebuilds it from its source
    REFUSE = "refuse"  # never evict it: only persisted objects (restorable by one read) are victims


POLICIES = tuple(p.value for p in PreparedModelPolicy)
EVICTION_POLICIES = tuple(p.value for p in EvictionPolicy)
ARENAS = ("preparation", "prepared", "execution", "io")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_BYTES_HELP = "a positive byte count: an int or a string such as '64MiB', '1.5GB', '4096' (units B, kB, MB, GB, TB, " \
              "KiB, MiB, GiB, TiB)"


class OptionIgnoredWarning(UserWarning):
    """An onnxruntime session option was set that onnx-prepared accepts but does not act on."""


def parse_bytes(value: Any, option: str = "size") -> int:
    """``64 << 20``, ``"64MiB"``, ``"1.5GB"`` -> bytes (> 0); anything else raises InvalidOptionError."""
    if isinstance(value, bool):
        raise InvalidOptionError(option, value, _BYTES_HELP)
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise InvalidOptionError(option, value, _BYTES_HELP)
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise InvalidOptionError(option, value, _BYTES_HELP)
    if n <= 0:
        raise InvalidOptionError(option, value, _BYTES_HELP)
    return n


# **** validators: (option name, value) -> the value to store ****


def _count(minimum: int, *, optional: bool = False) -> Callable[[str, Any], Any]:
    def check(name: str, v: Any) -> Any:
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise InvalidOptionError(name, v, f"an int >= {minimum}" + (" or None" if optional else ""))
        return v
    return check


def _size(name: str, v: Any) -> int | None:
    return None if v is None else parse_bytes(v, name)


def _flag(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidOptionError(name, v, "True or False")
    return v


def _choice(values: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(name: str, v: Any) -> str:
        s = getattr(v, "value", v)  # an enum member (PreparedModelPolicy) stands for its value
        if not isinstance(s, str) or s not in values:
            raise InvalidOptionError(name, v, "one of " + ", ".join(repr(x) for x in values))
        return s
    return check


def _level(values: dict[int, str]) -> Callable[[str, Any], Any]:
    """onnxruntime enum fields: its enum member, ours, or the int; stored as given."""
    allowed = ", ".join(f"{k} ({n})" for k, n in values.items())

    def check(name: str, v: Any) -> Any:
        try:
            n = int(v) if not isinstance(v, (bool, str, float)) else None
        except (TypeError, ValueError):
            n = None
        if n not in values:
            raise InvalidOptionError(name, v, f"one of {allowed}")
        return v
    return check


def _path(name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise InvalidOptionError(name, v, "a path (str or os.PathLike) or None")
    return os.fspath(v)


def _text(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidOptionError(name, v, "a str")
    return v


def _caps(name: str, v: Any) -> dict[str, int] | None:
    if v is None:
        return None
    if not isinstance(v, Mapping) or any(k not in ARENAS for k in v):
        raise InvalidOptionError(name, v, "None or a dict from arena name (" + ", ".join(ARENAS) + ") to bytes")
    return {k: b if type(b) is int and b >= 0 else parse_bytes(b, f"{name}[{k!r}]") for k, b in v.items()}


def _progress(name: str, v: Any) -> Any:
    if v is None or isinstance(v, bool) or callable(v):
        return v
    raise InvalidOptionError(name, v, "None, True (a tqdm bar on a terminal) or a callable(done, total)")


def _log_severity(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not -1 <= v <= 4:
        raise InvalidOptionError(name, v, "an int from -1 (default) to 4: 0 verbose, 1 info, 2 warning, 3 error, "
                                          "4 fatal")
    if v >= 0:  # like onnxruntime's default logger, the threshold is process-wide
        import logging

        logging.getLogger("onnx_prepared").setLevel((logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                                     logging.CRITICAL)[v])
    return v


def _anything(name: str, v: Any) -> Any:
    return v


# **** the fields ****

#: ours: name -> (default, validator, what it does)
OWN_FIELDS: dict[str, tuple[Any, Callable[[str, Any], Any], str]] = {
    "blas_threads": (None, _count(1, optional=True),
                     "OpenBLAS threads (process-wide), the same for every run since results depend on it "
                     "(None: 1; intra-op parallelism comes from the native kernels)"),
    "io_workers": (4, _count(1), "bounded I/O workers for external-data and cache reads"),
    "prepared_model_policy": ("disabled", _choice(POLICIES), "companion prepared model: " + " | ".join(POLICIES)),
    "prepared_model_path": (None, _path, "companion model path (default: a per-user cache folder keyed by the "
                                         "model's identity)"),
    "prepared_memory_limit": (None, _size, "bytes of resident prepared objects (None: unlimited); int or '64MiB'"),
    "eviction_policy": ("auto", _choice(EVICTION_POLICIES),
                        "under prepared_memory_limit: 'auto' persists then evicts, 'drop' evicts, 'refuse' fails"),
    "arena_retention_caps": (None, _caps, "retained free bytes kept per arena (preparation, prepared, execution, "
                                          "io); beyond it freed capacity is trimmed"),
    "memory_limit": (None, _size, "global byte budget of the scheduler's memory admission (None: unlimited)"),
    "trace": (False, _flag, "record a per-task trace (session.scheduler.trace), exportable to Perfetto"),
    "progress": (None, _progress, "prepare(): None/False silent, True a tqdm bar on a terminal, or "
                                  "callable(done, total) called as prepared objects become resident"),
}

#: every onnxruntime SessionOptions field: name -> (default, validator, honoured?, what happens)
ORT_FIELDS: dict[str, tuple[Any, Callable[[str, Any], Any], bool, str]] = {
    "intra_op_num_threads": (0, _count(0), True, "threads one kernel call may use (0: one per core), fewer while "
                                                 "preparation holds CPU slots"),
    "enable_profiling": (False, _flag, True, "records the per-task trace (same as trace=True)"),
    "log_severity_level": (-1, _log_severity, True, "threshold of the 'onnx_prepared' logger (process-wide)"),
    "inter_op_num_threads": (0, _count(0), False, "one scheduler overlaps independent work with one CPU worker "
                                                  "per core"),
    "execution_mode": (0, _level({0: "ORT_SEQUENTIAL", 1: "ORT_PARALLEL"}), False,
                       "the scheduler always runs independent tasks in parallel"),
    "execution_order": (0, _level({0: "DEFAULT", 1: "PRIORITY_BASED", 2: "MEMORY_EFFICIENT"}), False,
                        "the plan's node order is the model's topological order"),
    "graph_optimization_level": (99, _level({0: "ORT_DISABLE_ALL", 1: "ORT_ENABLE_BASIC", 2: "ORT_ENABLE_EXTENDED",
                                             3: "ORT_ENABLE_LAYOUT", 99: "ORT_ENABLE_ALL"}), False,
                                 "the resolver's transformations always run; they never change results"),
    "optimized_model_filepath": ("", _text, False, "no optimized model is written; the companion prepared model "
                                                   "(prepared_model_policy) is what persists"),
    "enable_cpu_mem_arena": (True, _flag, False, "our four arenas account memory; allocation is numpy's"),
    "enable_mem_pattern": (True, _flag, False, "execution buffers are numpy arrays, not a planned pattern"),
    "enable_mem_reuse": (True, _flag, False, "execution buffers are numpy arrays, not reused across nodes"),
    "use_deterministic_compute": (False, _flag, False, "kernels are deterministic for a given thread count already"),
    "use_per_session_threads": (True, _flag, False, "sessions with default resources share one scheduler"),
    "log_verbosity_level": (0, _count(0), False, "verbose logging is log_severity_level=0"),
    "logid": ("", _text, False, "log records name the 'onnx_prepared' logger"),
    "profile_file_prefix": ("onnxruntime_profile_", _text, True,
                            "InferenceSession.end_profiling() writes the trace to <prefix>_<date>_<time>.json"),
}

_ALL = {**{k: (d, v) for k, (d, v, _) in OWN_FIELDS.items()}, **{k: (d, v) for k, (d, v, _, _) in ORT_FIELDS.items()}}
#: every field's default, set in one update (a setattr per field was ~0.4 us each, ~50 a session)
_DEFAULTS = {name: default for name, (default, _v) in _ALL.items()}
_warned: set[str] = set()


class SessionOptions:
    """Settings of a session, checked when set; keyword arguments set fields too.

    >>> so = SessionOptions(prepared_memory_limit="64MiB")
    >>> so.prepared_model_policy = "build_if_missing"   # persist prepacked weights for the next process
    >>> sess = InferenceSession("model.onnx", so)

    Fields: :data:`OWN_FIELDS` (prepared execution) and :data:`ORT_FIELDS` (onnxruntime's, each honoured
    or accepted with a one-time :class:`OptionIgnoredWarning`). ``extra`` is a free dict for callers.
    """

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(_DEFAULTS, extra={}, _config={})  # (defaults are valid: no check)
        for name, value in fields.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        spec = _ALL.get(name)
        if spec is None:
            if name == "extra" and isinstance(value, dict):
                object.__setattr__(self, name, value)
                return
            import difflib

            near = difflib.get_close_matches(name, list(_ALL), n=1)
            raise UnknownOptionError(name, value, f"a known option{f' (did you mean {near[0]!r}?)' if near else ''}"
                                                  "; see onnx_prepared.options.OWN_FIELDS and ORT_FIELDS")
        default, validate = spec
        value = validate(name, value)
        ort = ORT_FIELDS.get(name)
        if ort is not None and not ort[2] and _plain(value) != default:
            _warn_once(name, ort[3])
        object.__setattr__(self, name, value)

    @property
    def records_trace(self) -> bool:
        """Whether a session with these options records its task trace (trace or enable_profiling)."""
        return bool(self.trace or self.enable_profiling)

    # **** onnxruntime's session config entries ****

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Stored for get_session_config_entry; no entry changes what onnx-prepared does (warns once)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidOptionError("add_session_config_entry", (key, value), "a (str, str) pair")
        _warn_once("add_session_config_entry", "onnx-prepared reads none of onnxruntime's config keys")
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidOptionError("get_session_config_entry", key, "a key set with add_session_config_entry")
        return self._config[key]

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _ALL}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionOptions) and self.to_dict() == other.to_dict() and self.extra == other.extra

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.to_dict().items() if v != _ALL[k][0]}
        return "SessionOptions(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"


def as_session_options(options: Any) -> SessionOptions:
    """None, a SessionOptions or a mapping of option names -> a validated SessionOptions.

    Other objects (e.g. an onnxruntime ``SessionOptions``) are copied field by field, with validation.
    """
    if isinstance(options, SessionOptions):
        return options
    if options is None:
        return SessionOptions()
    if isinstance(options, Mapping):
        return SessionOptions(**options)
    return SessionOptions(**{k: getattr(options, k) for k in _ALL if hasattr(options, k)})


def _plain(value: Any) -> Any:
    """An enum member (ours or onnxruntime's pybind one) as its int, for comparison with a default."""
    if isinstance(value, (bool, int, str, float)) or value is None:
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


def _warn_once(name: str, why: str) -> None:
    if name in _warned:
        return
    _warned.add(name)
    warnings.warn(f"SessionOptions.{name} has no effect in onnx-prepared: {why}", OptionIgnoredWarning, stacklevel=4)
