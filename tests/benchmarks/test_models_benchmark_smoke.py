"""Smoke test of ``benchmarks/models.py`` on two small corpus models (minimal sizes, no timing asserted)."""

from __future__ import annotations

import pytest

from tests.benchmarks.test_benchmarks_smoke import _finite, _module, _run

pytestmark = pytest.mark.slow


def test_models_benchmark(tmp_path, capsys):
    pytest.importorskip("torch")
    res = _run("models.py", "--models", "gru,loop_if", "--models-dir", str(tmp_path), "--reps", "1",
               "--create-reps", "1", "--batch-ms", "1")
    assert [r["model"] for r in res["rows"]] == ["gru", "loop_if"]
    for r in res["rows"]:
        assert r["match"] is True
        assert _finite(r["steady_ratio"], r["create_ratio"], r["first_ratio"], r["max_abs"])
        assert isinstance(r["fallback_ops"], dict)
    assert res["rows"][1]["fallback_ops"] == {}  # If and Loop run natively (bind/control_flow.py)
    _module("models").print_table(res)
    assert "steady x" in capsys.readouterr().out
