"""Module attributes that import their submodule on first access.

Packages whose import must stay light (``onnx_prepared`` itself, the CLI's ``genai`` and ``generate``)
name their heavy attributes in a table instead of importing them; the first access imports the submodule
and caches the value in the package's namespace, so later accesses are plain lookups.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, namespace: dict[str, Any], table: Mapping[str, str],
                    aliases: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from submodule ``table[name]`` (relative to
    ``package``), under the name ``aliases.get(name, name)`` there."""
    aliases = aliases or {}

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where}"), aliases.get(name, name))
        namespace[name] = value
        return value

    return __getattr__
