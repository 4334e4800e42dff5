"""Smoke test of benchmarks/kernels_nbits.py on one small shape: it completes, the table printer accepts its
result, and ``--autogroup-nice`` moves it to an autogroup of its own with that nice value. No timing is
asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _own_autogroup() -> str | None:
    """This process's autogroup ("/autogroup-N"), or None where the kernel gives none: the file may be
    missing, or present and empty (a sandboxed /proc, as on the CI runner)."""
    try:
        with open("/proc/self/autogroup") as f:
            fields = f.read().split()
    except OSError:
        return None
    return fields[0] if len(fields) == 3 and fields[0].startswith("/autogroup-") else None


@pytest.mark.skipif(_own_autogroup() is None, reason="no readable autogroup")
def test_kernels_nbits_in_an_autogroup_of_its_own():
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernels_nbits", "--json", "--shapes", "64x32",
                          "--rows", "1,3", "--repeat", "5", "--autogroup-nice", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    res = json.loads(out)
    group, _, nice = res["autogroup"].split()
    assert nice == "0" and group != _own_autogroup()
    assert [(r["M"], r["level"]) for r in res["rows"]] == [(1, 0), (3, 0), (1, 4), (3, 4)]
    assert all(r["rel_err"] < 1e-3 for r in res["rows"])
    sys.path.insert(0, str(ROOT))
    from benchmarks.kernels_nbits import print_table

    print_table(res)
