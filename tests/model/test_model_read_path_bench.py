"""benchmarks/read_path.py runs end to end on a small file (figures are not asserted) and cleans up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_read_path_benchmark_smoke(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "read_path.py")
    out = subprocess.run(
        [sys.executable, script, "--size-mb", "8", "--rounds", "1", "--min-tensor-mb", "1", "--max-tensor-mb", "4",
         "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    res = json.loads(out)
    assert res["size_mb"] == 8 and res["tensors"] == 4  # 1 + 2 + 4 + 1 MB
    assert {"reader", "preadv", "mmap_copy", "mmap_view"} <= set(res["methods"])
    for row in res["methods"].values():
        assert row["cold"]["median_gbps"] > 0 and row["warm"]["median_gbps"] > 0
    assert os.listdir(tmp_path) == []  # temp file deleted
