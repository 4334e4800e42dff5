"""Smoke test of ``benchmarks/llm.py`` on a small generated model standing in for ``tiny``: it completes,
reports every side and phase with a load average, and its printer accepts the result. No timing is asserted."""

from __future__ import annotations

import pytest

from onnx_prepared.generate import generate_tiny_llm
from tests.benchmarks.test_benchmarks_smoke import SMALL, _finite, _module, _run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("llm-bench-models")
    generate_tiny_llm(d / "tiny", **SMALL)
    return str(d)


def test_llm(models_dir, capsys):
    pytest.importorskip("onnxruntime")
    res = _run("llm.py", "--models-dir", models_dir, "--models", "tiny", "--levels", "4", "--prompts", "2,4",
               "--repeat", "1", "--profile")
    assert res["benchmark"] == "llm" and res["sides"] == ["ours", "ours-1t", "ort", "ort-1t"]
    assert [r["phase"] for r in res["rows"]] == ["prefill2", "prefill4", "decode"]
    for r in res["rows"]:
        assert _finite(r["ours_ms"], r["ours-1t_ms"], r["ort_ms"], r["ort-1t_ms"], r["ratio"], r["ratio_1t"])
        assert len(r["load_avg"]) == 3 and r["rel_err"] < 0.05
    assert res["rows"][-1]["goal"] == 1.0 and isinstance(res["rows"][-1]["meets"], bool)
    prof = res["rows"][-1]["profile"]["decode"]
    assert "MatMulNBits" in prof["op_types_ms"] and prof["run_ms"] > 0
    _module("llm").printer(res)
    out = capsys.readouterr().out
    assert "x ort" in out and "top op types" in out
