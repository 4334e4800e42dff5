"""docs/: the CLI reference is generated from argparse and must be current; pages are linked and links resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")


def read(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return f.read()


def test_cli_reference_is_current():
    """Fails when a CLI argument changed without `python docs/cli_reference.py` (argparse's wrapping is
    Python-version dependent: the page is generated with the Python CI runs)."""
    r = subprocess.run([sys.executable, os.path.join(DOCS, "cli_reference.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    text = read(DOCS, "cli.md")
    for cmd in ("demo", "run", "inspect", "generate", "generate-text", "bench", "cache build", "cache verify",
                "cache info"):
        assert f"## onnx-prepared {cmd}\n" in text


def test_every_page_is_linked_and_every_link_resolves():
    pages = sorted(f for f in os.listdir(DOCS) if f.endswith(".md") and f != "README.md")
    index = read(DOCS, "README.md")
    for page in pages:
        assert f"({page})" in index, page
    readme = read(ROOT, "README.md")
    assert "(docs/README.md)" in readme and "(docs/timeline.png)" in readme
    for name in ["README.md", *pages]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", read(DOCS, name)):
            if "://" not in target:
                assert os.path.exists(os.path.join(DOCS, target)), f"{name}: {target}"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), f"README.md: {target}"
