"""Kernels: one module per op family, registered into :mod:`onnx_prepared.kernels.registry`.

Importing this package imports every kernel module in it, so adding a kernel is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from onnx_prepared.kernels.registry import REGISTRY, KernelSpec, kernel, lookup

for _m in pkgutil.iter_modules(__path__):
    if _m.name not in ("registry", "prepack") and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["REGISTRY", "KernelSpec", "kernel", "lookup"]
