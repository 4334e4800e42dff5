import pytest

from onnx_prepared.model import load_model
from onnx_prepared.plan.prepared_plan import PlanError, TaskKind, TaskScope, build_prepared_plan
from onnx_prepared.resolve import resolve_model
from tests.helpers.models import gemm_mlp


def test_plan_shape_and_scopes(tmp_path):
    plan = build_prepared_plan(resolve_model(load_model(gemm_mlp(tmp_path, layers=2))))
    kinds = [(t.scope, t.kind) for t in plan.tasks]
    assert kinds.count((TaskScope.SESSION, TaskKind.READ_SOURCE)) == 4  # W0, c0, W1, c1
    assert kinds.count((TaskScope.SESSION, TaskKind.PREPACK)) == 2
    inv = plan.invocation_tasks
    assert [t.actions for t in inv] == [(0, 2), (2, 4)]  # one step per layer
    assert inv[1].dependencies[0] == inv[0].id  # sequential inference edge
    for t in plan.tasks:  # session tasks never depend on invocation tasks
        if t.scope is TaskScope.SESSION:
            assert all(plan.by_id[d].scope is TaskScope.SESSION for d in t.dependencies)
    # the second step waits on exactly its own prepared objects
    assert set(inv[1].dependencies[1:]) == {plan.producer[k] for k in inv[1].prepared_requirements}
    assert "S.W1.read_source" in plan.table()


def test_plan_rejects_unfrozen_or_incomplete_model(tmp_path):
    with pytest.raises(PlanError, match="frozen ResolvedModel"):
        build_prepared_plan(load_model(gemm_mlp(tmp_path)))
    r = resolve_model(load_model(gemm_mlp(tmp_path)))
    import dataclasses

    broken = dataclasses.replace(r, kernels=r.kernels[:-1])
    with pytest.raises(PlanError, match="incomplete"):
        build_prepared_plan(broken)


def test_session_closure_orders_dependencies_first(tmp_path):
    plan = build_prepared_plan(resolve_model(load_model(gemm_mlp(tmp_path, layers=1))))
    prepack = next(t.id for t in plan.tasks if t.kind is TaskKind.PREPACK)
    assert plan.session_closure([prepack]) == ["S.W0.read_source", prepack]


def test_plan_runs_the_bindings_resolution_made(tmp_path):
    """A node's kernel is chosen once, at resolution: every action calls the ResolvedModel's binding."""
    resolved = resolve_model(load_model(gemm_mlp(tmp_path, layers=2)))
    plan = build_prepared_plan(resolved)
    assert len(plan.execution.actions) == len(resolved.kernels)
    for act in plan.execution.actions:
        assert act.kernel is resolved.kernels[act.node_index]
    assert resolved.kernel_choices == tuple(k.name for k in resolved.kernels)
    assert any(name.startswith("prepacked:") for name in resolved.kernel_choices)


def test_initializers_only_prepacks_read_get_no_slot(tmp_path):
    plan = build_prepared_plan(resolve_model(load_model(gemm_mlp(tmp_path, layers=2))))
    names = set(plan.execution.slot_names)
    assert not {"W0", "W1"} & names  # read by their prepacks alone
    assert {"x", "c0", "c1"} <= names  # a graph input, and the raw biases the Gemms read
    assert all(s >= 0 for s in plan.requirement_slots)  # every prepared object still has its slot
