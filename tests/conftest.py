"""Suite-wide isolation: the package's user caches (schema facts, verification records, the demo model)
live under ``$XDG_CACHE_HOME``, so every test process gets its own empty one instead of ``~/.cache``.

Set in ``pytest_configure`` (before any test module imports the package) and inherited by the subprocesses
tests start; tests that need a particular cache folder still set their own with ``monkeypatch``.
"""

import os
import shutil
import tempfile

_made: list[str] = []


def pytest_configure(config) -> None:
    _made.append(tempfile.mkdtemp(prefix="onnx-prepared-xdg-"))
    os.environ["XDG_CACHE_HOME"] = _made[-1]


def pytest_unconfigure(config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)
