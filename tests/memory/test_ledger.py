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
        (cold,) = s.run({"x": x})  # cold: a reservation grown step by step to the measured peak
        ex = s.arenas.execution
        assert s.counters["cold_runs"] == 1 and s.state.execution_peak > 0
        assert ex.live == 0 and ex.peak_live >= s.state.execution_peak
        before = ex.allocations
        (hot,) = s.run({"x": x})  # hot: the measured peak, charged once for the run
        assert s.counters["hot_runs"] == 1
        assert ex.allocations == before + 1 and ex.live == 0
    np.testing.assert_array_equal(cold, hot)


def _split_with_unused_output(folder) -> str:
    """x[2, 1024] -> Split -> (a[2, 4] -> Relu -> y, b[2, 1020] unused): b's own action releases it."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.helpers.models import save_external

    split = numpy_helper.from_array(np.array([4, 1020], np.int64), "split")
    g = helper.make_graph(
        [helper.make_node("Split", ["x", "split"], ["a", "b"], name="split", axis=1),
         helper.make_node("Relu", ["a"], ["y"], name="relu")],
        "split_unused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [split])
    return save_external(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), folder)


def _figures(s, x) -> tuple[dict, np.ndarray]:
    """Run once on a fresh ExecutionArena peak; the arena's figures after the run, and the output."""
    ex = s.arenas.execution
    ex.peak_live = 0
    (y,) = s.run({"x": x})
    return {"live": ex.live, "peak_live": ex.peak_live}, y


@pytest.mark.parametrize("model", ["mlp", "split"])
def test_hot_and_cold_runs_of_one_model_leave_the_same_execution_arena_figures(tmp_path, model):
    """One mechanism (ExecutionFrame's reservation): a cold run, a hot run before any peak was measured
    and a hot run reserving the measured peak report the same live and peak ExecutionArena bytes."""
    if model == "mlp":
        path, x = gemm_mlp(tmp_path, layers=3, width=32), np.ones((2, 32), np.float32)
    else:
        path, x = _split_with_unused_output(tmp_path), np.arange(2048, dtype=np.float32).reshape(2, 1024)
    with RuntimeSession(path) as s:
        cold, y_cold = _figures(s, x)
        assert s.counters["cold_runs"] == 1
        hot, y_hot = _figures(s, x)
        assert s.counters["hot_runs"] == 1
    with RuntimeSession(path) as s:
        s.prepare()
        assert s.state.execution_peak == 0
        first_hot, _ = _figures(s, x)  # hot, no peak measured yet: it steps and measures
        assert s.counters["hot_runs"] == 1 and s.counters["cold_runs"] == 0
    assert cold == hot == first_hot and cold["live"] == 0 and cold["peak_live"] > 0
    if model == "split":  # the unused output b counts while its own action holds it: a + b = all of x
        assert cold["peak_live"] == x.nbytes
    np.testing.assert_array_equal(y_cold, y_hot)
