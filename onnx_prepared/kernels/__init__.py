"""Kernels: one module per op family, registered into :mod:`onnx_prepared.kernels.registry`.

Importing this package imports no kernel module: :mod:`onnx_prepared.kernels.catalog` names the module
of each op, and the registry imports it on the op's first lookup, so a session loads only the kernels its
model uses. Adding a kernel is adding a file (or a function) and its line in the catalog.
"""

from __future__ import annotations

from onnx_prepared.kernels.registry import REGISTRY, KernelSpec, kernel, lookup

__all__ = ["REGISTRY", "KernelSpec", "kernel", "lookup"]
