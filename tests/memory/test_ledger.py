"""One memory ledger: one Domain enum, real arena limits, and both inference paths charge ExecutionArena."""

import pathlib
import re

import numpy as np
import pytest

import onnx_prepared
from onnx_prepared.memory import Arena, ArenaLimitError, Arenas, Domain
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.scheduler import Domain as SchedulerDomain
from onnx_prepared.scheduler import MemoryEstimate
from tests.helpers.models import gemm_mlp


def test_one_domain_enum_for_arenas_budget_and_estimates():
    assert SchedulerDomain is Domain
    arenas = Arenas.create()
    assert [arenas[d].name for d in Domain] == ["PreparationArena", "PreparedArena", "ExecutionArena", "IOArena"]
    assert arenas[Domain.PREPARED] is arenas["prepared"] is arenas.prepared
    assert set(arenas.snapshot()) == {d.value for d in Domain}
    assert MemoryEstimate(Domain.PREPARED, output=1).domain is Domain.PREPARED


def test_no_production_code_forces_past_an_arena_limit():
    """Arena limits are real: work waits in admission before allocating; only tests may pass force."""
    root = pathlib.Path(onnx_prepared.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if re.search(r"force\s*=\s*True", p.read_text())]
    assert offenders == []


def test_over_limit_acquisition_names_the_arena_and_allocation():
    a = Arena("ExecutionArena", limit=100)
    a.acquire(60, "x")
    with pytest.raises(ArenaLimitError, match=r"ExecutionArena: 50 bytes for activation .*60 live of 100"):
        a.acquire(50, "activation")
    assert a.live == 60


def test_hot_and_cold_runs_both_charge_the_execution_arena(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    with RuntimeSession(gemm_mlp(tmp_path, layers=3, width=32)) as s:
        (cold,) = s.run({"x": x})  # cold: one allocation per produced activation
        ex = s.arenas.execution
        assert s.counters["cold_runs"] == 1 and s.state.execution_peak > 0
        assert ex.live == 0 and ex.peak_live >= s.state.execution_peak
        before = ex.allocations
        (hot,) = s.run({"x": x})  # hot: the measured peak, charged once for the run
        assert s.counters["hot_runs"] == 1
        assert ex.allocations == before + 1 and ex.live == 0
    np.testing.assert_array_equal(cold, hot)
