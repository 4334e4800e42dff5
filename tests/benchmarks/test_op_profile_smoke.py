"""Smoke test of ``benchmarks/op_profile.py`` on a small corpus model (no timing asserted)."""

from __future__ import annotations

import pytest

from tests.benchmarks.test_benchmarks_smoke import _finite, _module, _run

pytestmark = pytest.mark.slow


def test_op_profile(tmp_path, capsys):
    pytest.importorskip("torch")
    res = _run("op_profile.py", "--models", "gru", "--models-dir", str(tmp_path), "--reps", "2")
    (m,) = res["models"]
    assert m["model"] == "gru" and "GRU" in m["ours"] and m["ort"]
    assert all(_finite(ms) and n >= 1 for ms, n in m["ours"].values())
    _module("op_profile")._print(res)
    assert "sum of per-node medians" in capsys.readouterr().out
