"""The kernel catalog lists exactly the ops each kernel module registers (kernels and prepack rules)."""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict

import onnx_prepared.kernels as K
from onnx_prepared.kernels import catalog, prepack, registry


def _registered() -> dict[str, set[str]]:
    for m in pkgutil.iter_modules(K.__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"onnx_prepared.kernels.{m.name}")
    found: dict[str, set[str]] = defaultdict(set)

    def add(fn, domain: str, op: str) -> None:
        found[fn.__module__.rsplit(".", 1)[1]].add(f"{domain}:{op}" if domain else op)

    for (domain, op), versions in registry.REGISTRY.items():
        for spec in versions.values():
            add(spec.fn, domain, op)
    for (domain, op), rules in prepack.RULES.items():
        for rule in rules:
            add(rule, domain, op)
    return found


def test_catalog_matches_registrations():
    found = _registered()
    listed = {mod: set(ops) for mod, ops in catalog.MODULES.items()}
    assert listed == dict(found), "update onnx_prepared/kernels/catalog.py: it must list every @kernel/@prepack_rule op"


def test_lookup_imports_the_module_on_first_use():
    spec = registry.lookup("com.microsoft", "MatMulNBits", 1)
    assert spec is not None and spec.fn.__module__ == "onnx_prepared.kernels.matmul_nbits"
    assert registry.lookup("ai.onnx", "Gemm", 13).name == "ai.onnx::Gemm-7"
    assert registry.lookup("", "NoSuchOp", 13) is None
