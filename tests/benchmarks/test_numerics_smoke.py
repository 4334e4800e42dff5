"""Smoke test of ``benchmarks/numerics.py`` on a small generated model standing in for ``tiny``: every output
and op type is reported, level 0 matches onnxruntime within the tolerance, the norms are bit-exact, and the
printer accepts the result."""

from __future__ import annotations

import pytest

from onnx_prepared.generate import generate_tiny_llm
from tests.benchmarks.test_benchmarks_smoke import SMALL, _module, _run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("numerics-models")
    generate_tiny_llm(d / "tiny", **SMALL)
    return str(d)


def test_numerics(models_dir, capsys):
    pytest.importorskip("onnxruntime")
    res = _run("numerics.py", "--models-dir", models_dir, "--models", "tiny", "--levels", "4,0", "--prompt", "4",
               "--layers", "1")
    assert res["benchmark"] == "numerics" and [r["level"] for r in res["rows"]] == [4, 0]
    for r in res["rows"]:
        assert {"logits", "present.0.key", "present.0.value"} <= set(r["whole"])
        assert all(d["first_equals_later"] for d in r["whole"].values())
        assert {"MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= set(r["ops"])
        for s in r["ops"].values():
            assert 0 <= s["bit_exact"] <= s["nodes"] and s["max_abs"] >= 0
        norm = r["ops"]["SkipSimplifiedLayerNormalization"]
        assert norm["bit_exact"] == norm["nodes"]
    level0 = res["rows"][1]["whole"]
    assert all(d["outside"] == 0 for d in level0.values())
    _module("numerics").printer(res)
    assert "bit-exact" in capsys.readouterr().out
