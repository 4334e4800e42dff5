"""onnxruntime's module-level names: enums, provider queries, logger and telemetry switches, RunOptions.

One provider exists, ``CPUExecutionProvider``. A session asked for any other gets onnxruntime's own
answer to a provider it was not built with: a ``UserWarning`` naming it and the available ones, then
CPU (:func:`check_providers`).
"""

from __future__ import annotations

import enum
import logging
import warnings
from collections.abc import Sequence
from typing import Any

CPU = "CPUExecutionProvider"

#: what onnxruntime 1.32's get_all_providers() lists (every provider some build of it can have)
_ALL_PROVIDERS = (
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider", "ROCMExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider",
    "NnapiExecutionProvider", "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
    "ArmNNExecutionProvider", "ACLExecutionProvider", "DmlExecutionProvider", "RknpuExecutionProvider",
    "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider", "CANNExecutionProvider",
    "AzureExecutionProvider", CPU,
)


class GraphOptimizationLevel(enum.IntEnum):
    """Accepted for ``SessionOptions.graph_optimization_level`` (our transformations never change results)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


def get_available_providers() -> list[str]:
    return [CPU]


def get_all_providers() -> list[str]:
    return list(_ALL_PROVIDERS)


def get_device() -> str:
    return "CPU"


def get_version_string() -> str:
    from onnx_prepared import __version__

    return __version__


def get_build_info() -> str:
    from onnx_prepared import __version__

    return f"onnx-prepared {__version__} (numpy + onnx; CPU only)"


_telemetry = {"enabled": False}


def disable_telemetry_events() -> None:
    """onnx-prepared sends no telemetry; recorded so ``enable_telemetry_events`` round-trips."""
    _telemetry["enabled"] = False


def enable_telemetry_events() -> None:
    """Accepted; nothing is ever sent (there is no telemetry to enable)."""
    _telemetry["enabled"] = True


_SEVERITY = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)


def set_default_logger_severity(severity: int) -> None:
    """Threshold of the ``onnx_prepared`` logger: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal."""
    if isinstance(severity, bool) or not isinstance(severity, int) or not 0 <= severity <= 4:
        raise ValueError(f"set_default_logger_severity: expected an int from 0 to 4, got {severity!r}")
    logging.getLogger("onnx_prepared").setLevel(_SEVERITY[severity])


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted for onnxruntime code; verbose output is ``set_default_logger_severity(0)``."""
    if isinstance(verbosity, bool) or not isinstance(verbosity, int) or verbosity < 0:
        raise ValueError(f"set_default_logger_verbosity: expected an int >= 0, got {verbosity!r}")


def set_seed(seed: int) -> None:
    """Seeds numpy's global generator, which the fallback's random ops draw from."""
    import numpy as np

    np.random.seed(int(seed) % (2**32))


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0, inter_op_num_threads: int = 0) -> None:
    """Accepted; each session's ``SessionOptions.intra_op_num_threads`` sizes its scheduler."""


class RunOptions:
    """onnxruntime's per-run options. ``terminate`` is honoured by :meth:`InferenceSession.run` callers
    through ``run_async(...).cancel()``; the other fields are kept for code that reads them back."""

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self.synchronize_execution_providers = True
        self.terminate = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        return self._config[key]


def provider_name(p: Any) -> str:
    """A providers-list entry (a name, or ``(name, options)``) as its name."""
    if isinstance(p, str):
        return p
    if isinstance(p, (tuple, list)) and p and isinstance(p[0], str):
        return p[0]
    raise ValueError(f"providers entries are names or (name, options dict) pairs, got {p!r}")


def check_providers(providers: Sequence[Any] | None, provider_options: Sequence[dict] | None = None) -> list[str]:
    """The providers a session uses (always ``['CPUExecutionProvider']``), warning like onnxruntime for
    each requested one this build does not have."""
    if providers is None:
        return [CPU]
    if isinstance(providers, str):
        raise ValueError("providers must be a list of names, e.g. ['CPUExecutionProvider'], not a string")
    if provider_options is not None and len(provider_options) != len(providers):
        raise ValueError("'providers' and 'provider_options' should be the same length if both are given")
    for p in providers:
        name = provider_name(p)
        if name != CPU:
            warnings.warn(f"Specified provider '{name}' is not in available provider names."
                          f"Available providers: '{', '.join(get_available_providers())}'", UserWarning, stacklevel=3)
    return [CPU]
