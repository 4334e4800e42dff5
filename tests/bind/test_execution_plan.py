"""ExecutionPlan: ordering, release after last use, load-time graph errors, kernel error reporting."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_prepared.bind import NONE_SLOT, BoundKernel, build_execution_plan, live_bytes
from onnx_prepared.bind import execution_plan as ep
from onnx_prepared.errors import KernelError, ModelLoadError

OPSETS = {"": 17}


@pytest.fixture(autouse=True, params=["step-loop", "compiled"])
def replay_kind(request, monkeypatch):
    """Every test on both full-replay paths: the step loop, and the compiled straight-line replay."""
    monkeypatch.setattr(ep, "COMPILE_AFTER", 10**9 if request.param == "step-loop" else 1)
    return request.param


def _vi(name, shape=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _graph(nodes, inputs=("x",), outputs=("y",), initializers=()):
    return helper.make_graph(nodes, "g", [_vi(n) for n in inputs], [_vi(n) for n in outputs], list(initializers))


def _double(a):
    return (a * 2.0,)


def _bind_double(node):
    return BoundKernel(_double, f"test::{node.op_type}", False)


def _run(plan, feeds, **hooks):
    values = plan.new_values()
    for s in plan.input_slots:
        values[s] = feeds[plan.slot_names[s]]
    plan.replay(values, **hooks)
    return values


def _chain(n):
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    return [helper.make_node("Neg", [names[i]], [names[i + 1]], name=f"n{i}") for i in range(n)]


# ---- memory: intermediates are released after their last use ----


def test_chain_peak_live_bytes_stays_two_activations():
    n = 12
    plan = build_execution_plan(_graph(_chain(n)), OPSETS, bind=_bind_double)
    x = np.ones((64, 64), dtype=np.float32)
    act = x.nbytes
    x_slot = plan.input_slots[0]
    peaks: list[int] = []
    released: list[int] = []

    def on_step(action, values):  # after outputs are stored, before releases: the step's peak
        peaks.append(live_bytes([v for s, v in enumerate(values) if s != x_slot]))

    values = _run(plan, {"x": x}, on_step=on_step, on_release=released.append)
    assert len(peaks) == n
    assert max(peaks) == 2 * act  # previous activation + the new one, never more
    assert peaks[0] == act
    # every intermediate t0..t{n-2} released exactly once; input and output kept
    assert sorted(plan.slot_names[s] for s in released) == sorted(f"t{i}" for i in range(n - 1))
    assert live_bytes(values) == 2 * act  # only x and y survive the run
    np.testing.assert_array_equal(values[plan.output_slots[0]], x * 2.0**n)


def test_hot_path_releases_too():
    # No hooks: the kernels themselves look at the run's value list when they are called.
    n = 8
    values_box: list[list] = []
    seen: list[int] = []

    def spying_double(a):
        seen.append(live_bytes(values_box[0]))
        return (a * 2.0,)

    plan = build_execution_plan(_graph(_chain(n)), OPSETS, bind=lambda node: BoundKernel(spying_double, "spy", False))
    x = np.ones((32, 32), dtype=np.float32)
    values = plan.new_values()
    values[plan.input_slots[0]] = x
    values_box.append(values)
    plan.replay(values)
    # at each call: the input x plus at most the one activation being read
    assert seen == [x.nbytes] + [2 * x.nbytes] * (n - 1)
    assert live_bytes(values) == 2 * x.nbytes


def test_value_is_released_by_its_last_reader():
    # x -> a; a -> b; (a, b) -> y: `a` must live until the third node, `b` is freed there too.
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="first"),
        helper.make_node("Neg", ["a"], ["b"], name="second"),
        helper.make_node("Add", ["a", "b"], ["y"], name="third"),
    ]
    plan = build_execution_plan(_graph(nodes), OPSETS, bind=lambda n: BoundKernel(
        (lambda *xs: (sum(xs),)), n.op_type, False))
    release_by_node = {plan.node_labels[a.node_index].split()[0]: {plan.slot_names[s] for s in a.release}
                       for a in plan.actions}
    assert release_by_node == {"'first'": set(), "'second'": set(), "'third'": {"a", "b"}}


def test_outer_scope_value_lives_until_the_subgraph_node_reads_it():
    # `outer` is read only inside If's branches (an implicit input): it must not be released earlier.
    then_g = helper.make_graph([helper.make_node("Identity", ["outer"], ["r"])], "then", [], [_vi("r")])
    else_g = helper.make_graph([helper.make_node("Neg", ["outer"], ["r2"])], "else", [], [_vi("r2")])
    nodes = [
        helper.make_node("Neg", ["x"], ["outer"], name="make_outer"),
        helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("v", TensorProto.BOOL, [], [False])),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"),
    ]
    g = _graph(nodes)
    plan = build_execution_plan(g, OPSETS)
    by_name = {plan.node_labels[a.node_index].split()[0]: a for a in plan.actions}
    assert by_name["'branch'"].kernel.implicit_inputs == ("outer",)
    assert "outer" in {plan.slot_names[s] for s in by_name["'branch'"].release}
    assert "outer" not in {plan.slot_names[s] for s in by_name["'make_outer'"].release}
    x = np.arange(4, dtype=np.float32)
    values = _run(plan, {"x": x})
    np.testing.assert_array_equal(values[plan.output_slots[0]], x)  # else branch: Neg(Neg(x))


# ---- ordering ----


def test_out_of_order_graph_is_topologically_reordered():
    nodes = list(reversed(_chain(5)))  # file order is the reverse of data flow
    plan = build_execution_plan(_graph(nodes), OPSETS, bind=_bind_double)
    assert [a.node_index for a in plan.actions] == [4, 3, 2, 1, 0]
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(_run(plan, {"x": x})[plan.output_slots[0]], x * 32)


def test_in_order_graph_keeps_file_order():
    plan = build_execution_plan(_graph(_chain(4)), OPSETS, bind=_bind_double)
    assert [a.node_index for a in plan.actions] == [0, 1, 2, 3]


def test_diamond_order_is_stable_on_file_order():
    nodes = [
        helper.make_node("Add", ["p", "q"], ["y"], name="join"),
        helper.make_node("Neg", ["x"], ["q"], name="right"),
        helper.make_node("Neg", ["x"], ["p"], name="left"),
    ]
    plan = build_execution_plan(_graph(nodes), OPSETS, bind=lambda n: BoundKernel(
        (lambda *xs: (sum(xs),)), n.op_type, False))
    assert [a.node_index for a in plan.actions] == [1, 2, 0]


# ---- load-time graph errors ----


def test_reading_a_name_nothing_produces_is_a_load_error():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    with pytest.raises(ModelLoadError, match=r"'adder'.*'ghost'"):
        build_execution_plan(_graph(nodes), OPSETS, bind=_bind_double)


def test_subgraph_reading_an_unknown_outer_name_is_a_load_error():
    then_g = helper.make_graph([helper.make_node("Identity", ["nowhere"], ["r"])], "then", [], [_vi("r")])
    nodes = [helper.make_node("If", ["x"], ["y"], then_branch=then_g, else_branch=then_g, name="branch")]
    with pytest.raises(ModelLoadError, match=r"'branch'.*'nowhere'"):
        build_execution_plan(_graph(nodes), OPSETS)


def test_unproduced_graph_output_is_a_load_error():
    with pytest.raises(ModelLoadError, match="'z'"):
        build_execution_plan(_graph(_chain(2), outputs=("y", "z")), OPSETS, bind=_bind_double)


def test_cycle_is_a_load_error():
    nodes = [helper.make_node("Neg", ["b"], ["a"], name="p"), helper.make_node("Neg", ["a"], ["b"], name="q"),
             helper.make_node("Neg", ["x"], ["y"])]
    with pytest.raises(ModelLoadError, match="cycle"):
        build_execution_plan(_graph(nodes), OPSETS, bind=_bind_double)


def test_value_produced_twice_is_a_load_error():
    nodes = [helper.make_node("Neg", ["x"], ["y"], name="p"), helper.make_node("Neg", ["x"], ["y"], name="q")]
    with pytest.raises(ModelLoadError, match="'y' is produced twice"):
        build_execution_plan(_graph(nodes), OPSETS, bind=_bind_double)


# ---- kernel failures ----


def test_kernel_exception_becomes_kernel_error_naming_node_op_and_inputs():
    boom = ValueError("bad operand")

    def failing(a, b):
        raise boom

    nodes = [helper.make_node("Neg", ["x"], ["t"], name="ok"),
             helper.make_node("Mul", ["t", "w"], ["y"], name="the_mul")]
    plan = build_execution_plan(
        _graph(nodes, inputs=("x", "w")), OPSETS,
        bind=lambda n: BoundKernel(failing if n.op_type == "Mul" else _double, f"test::{n.op_type}", False))
    with pytest.raises(KernelError) as info:
        _run(plan, {"x": np.zeros((2, 3), np.float32), "w": np.zeros((3,), np.int64)})
    msg = str(info.value)
    assert "'the_mul' (Mul)" in msg and "test::Mul" in msg
    assert "float32[2, 3], int64[3]" in msg
    assert "ValueError: bad operand" in msg
    assert info.value.__cause__ is boom


# ---- omitted optional inputs and outputs ----


def test_omitted_optional_input_reads_none_and_omitted_output_is_cleared():
    seen = []

    def kern(a, absent, c):
        seen.append(absent)
        return (a + c, a * 0)  # second output is omitted by the node

    nodes = [helper.make_node("Op", ["x", "", "x"], ["y", ""], name="k")]
    plan = build_execution_plan(_graph(nodes), OPSETS, bind=lambda n: BoundKernel(kern, "test::Op", False))
    (act,) = plan.actions
    assert act.inputs[1] == NONE_SLOT and act.outputs[1] == NONE_SLOT and NONE_SLOT in act.release
    values = _run(plan, {"x": np.ones(2, np.float32)})
    assert seen == [None]
    assert values[NONE_SLOT] is None
    np.testing.assert_array_equal(values[plan.output_slots[0]], [2.0, 2.0])


def test_plan_replays_independently_per_run():
    plan = build_execution_plan(_graph(_chain(3)), OPSETS, bind=_bind_double)
    a = _run(plan, {"x": np.ones(2, np.float32)})
    b = _run(plan, {"x": np.full(2, 3.0, np.float32)})
    np.testing.assert_array_equal(a[plan.output_slots[0]], [8.0, 8.0])
    np.testing.assert_array_equal(b[plan.output_slots[0]], [24.0, 24.0])


def test_initializers_get_constant_slots_and_are_never_released():
    w = onnx.numpy_helper.from_array(np.ones(2, np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "w"], ["y"])]
    plan = build_execution_plan(_graph(nodes, initializers=[w]), OPSETS, bind=lambda n: BoundKernel(
        (lambda a, b: (a + b,)), "add", False))
    w_slot = plan.constant_slots["w"]
    assert all(w_slot not in a.release for a in plan.actions)


def test_constant_nodes_are_computed_once_and_are_no_action():
    """A Constant feeding a node is folded into every run's starting slot list (read-only, shared);
    one that is a graph output stays an action (the caller owns what it gets back)."""
    import onnx_prepared

    nodes = [helper.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0, 3.0]),
             helper.make_node("Constant", [], ["shape"], value_ints=[3, 1]),
             helper.make_node("Mul", ["x", "k"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["y"]),
             helper.make_node("Constant", [], ["c_out"], value_float=5.0)]
    g = helper.make_graph(nodes, "g", [_vi("x", [3])], [_vi("y", [3, 1]), _vi("c_out", [])])
    plan = build_execution_plan(g, OPSETS)
    assert [g.node[a.node_index].op_type for a in plan.actions] == ["Mul", "Reshape", "Constant"]
    values = plan.new_values()
    k = values[plan.slot_names.index("k")]
    np.testing.assert_array_equal(k, [1.0, 2.0, 3.0])
    assert not k.flags.writeable
    values[plan.input_slots[0]] = np.ones(3, np.float32)
    plan.replay(values)
    np.testing.assert_array_equal(values[plan.output_slots[0]], [[1.0], [2.0], [3.0]])
    sess = onnx_prepared.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                                          .SerializeToString())
    for _ in range(3):  # cold, then hot runs: the folded values are there every time
        y, c = sess.run(None, {"x": np.ones(3, np.float32)})
        np.testing.assert_array_equal(y, [[1.0], [2.0], [3.0]])
        assert c == 5.0 and c.flags.writeable
        sess.prepare()


def test_a_constant_that_cannot_be_computed_stays_an_action_and_fails_the_run():
    g = _graph([helper.make_node("Constant", [], ["k"]), helper.make_node("Add", ["x", "k"], ["y"])])
    plan = build_execution_plan(g, OPSETS)
    assert len(plan.actions) == 2
    values = plan.new_values()
    values[plan.input_slots[0]] = np.ones(2, np.float32)
    with pytest.raises(KernelError, match="Constant"):
        plan.replay(values)


# ---- the compiled replay ----


def test_a_plan_compiles_its_replay_after_its_first_full_replays(monkeypatch):
    monkeypatch.setattr(ep, "COMPILE_AFTER", 2)
    plan = build_execution_plan(_graph(_chain(3)), OPSETS, bind=_bind_double)
    outs = []
    for i in range(4):
        outs.append(_run(plan, {"x": np.full(2, float(i), np.float32)})[plan.output_slots[0]])
        assert (plan.compiled[1] is not None) == (i >= 1)
    for i, y in enumerate(outs):
        np.testing.assert_array_equal(y, [8.0 * i] * 2)


def test_failure_in_a_late_action_of_a_compiled_replay_names_that_node():
    def failing(a):
        raise ZeroDivisionError("late")

    plan = build_execution_plan(
        _graph(_chain(5)), OPSETS,
        bind=lambda n: BoundKernel(failing if n.name == "n3" else _double, f"test::{n.name}", False))
    with pytest.raises(KernelError, match=r"'n3' \(Neg\) \[test::n3\] failed on inputs \(float32\[2\]\)"):
        _run(plan, {"x": np.ones(2, np.float32)})


def test_a_kernel_returning_fewer_values_than_outputs_stores_those_it_returned():
    nodes = [helper.make_node("Op", ["x"], ["a", "b"], name="k"), helper.make_node("Neg", ["a"], ["y"], name="n")]
    plan = build_execution_plan(
        _graph(nodes), OPSETS,
        bind=lambda n: BoundKernel((lambda x: (x + 1.0,)) if n.op_type == "Op" else _double, "test", False))
    values = _run(plan, {"x": np.ones(2, np.float32)})
    np.testing.assert_array_equal(values[plan.output_slots[0]], [4.0, 4.0])


def test_replaced_steps_are_what_a_full_replay_runs(monkeypatch):
    # a profiler (benchmarks/llm.py timed_kernels) wraps the plan's steps from outside: a compiled replay
    # must run the wrapped calls, and the plain ones again once the steps are restored
    monkeypatch.setattr(ep, "COMPILE_AFTER", 1)
    plan = build_execution_plan(_graph(_chain(3)), OPSETS, bind=_bind_double)
    x = {"x": np.ones(2, np.float32)}
    _run(plan, x)
    calls = []

    def counted(call):
        return lambda *a: calls.append(1) or call(*a)

    orig = plan.steps
    object.__setattr__(plan, "steps", tuple((counted(st[0]), *st[1:]) for st in orig))
    np.testing.assert_array_equal(_run(plan, x)[plan.output_slots[0]], [8.0, 8.0])
    assert len(calls) == 3
    object.__setattr__(plan, "steps", orig)
    _run(plan, x)
    assert len(calls) == 3
