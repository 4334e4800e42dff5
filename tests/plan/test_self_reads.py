"""Small inline sources are read by the task that consumes them: no read task, no invocation step of their own."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.model import load_model
from onnx_prepared.plan.prepared_plan import SELF_READ_BYTES, TaskKind, build_prepared_plan
from onnx_prepared.resolve import resolve_model
from onnx_prepared.runtime import RuntimeSession

RNG = np.random.default_rng(0)
W0, C0 = RNG.standard_normal((16, 16)).astype(np.float32), RNG.standard_normal(16).astype(np.float32)
BIG = 1200  # W1 [16, 1200] float32: 76,800 bytes, above SELF_READ_BYTES
W1, C1 = RNG.standard_normal((16, BIG)).astype(np.float32), RNG.standard_normal(BIG).astype(np.float32)
X = RNG.standard_normal((3, 16)).astype(np.float32)


def _two_gemms(folder) -> str:
    """x -> Gemm(W0, c0) -> Relu -> Gemm(W1, c1), every initializer inline."""
    nodes = [helper.make_node("Gemm", ["x", "W0", "c0"], ["g0"], name="gemm0"),
             helper.make_node("Relu", ["g0"], ["r0"], name="relu0"),
             helper.make_node("Gemm", ["r0", "W1", "c1"], ["y"], name="gemm1")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((W0, "W0"), (C0, "c0"), (W1, "W1"), (C1, "c1"))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", BIG])], inits)
    path = str(folder / "two_gemms.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_small_inline_sources_get_no_read_task(tmp_path):
    assert W0.nbytes <= SELF_READ_BYTES < W1.nbytes
    plan = build_prepared_plan(resolve_model(load_model(_two_gemms(tmp_path))))
    reads = [t.sources for t in plan.session_tasks if t.kind is TaskKind.READ_SOURCE]
    assert reads == [("W1",)]  # the one large inline source keeps its read task
    for t in plan.session_tasks:
        if t.kind is TaskKind.READ_SOURCE:
            continue
        if t.sources == ("W1",):  # its prepack waits for that read
            assert t.self_reads == () and [plan.by_id[d].kind for d in t.dependencies] == [TaskKind.READ_SOURCE]
        else:  # W0's prepack, c0's and c1's raw publishes read their source themselves
            assert t.self_reads == t.sources and t.dependencies == ()
    # only the large prepack starts an invocation step of its own
    assert [t.actions for t in plan.invocation_tasks] == [(0, 2), (2, 3)]


def test_self_read_sessions_compute_the_same_bits_first_and_later(tmp_path):
    expected = np.maximum(X @ W0 + C0, 0) @ W1 + C1
    with RuntimeSession(_two_gemms(tmp_path), {"trace": True}) as s:
        first = s.run({"x": X})[0]
        later = [s.run({"x": X})[0] for _ in range(2)]
        ran = sorted(r.name for r in s.scheduler.trace.records() if r.name.startswith("S."))
        assert ran == sorted(t.id for t in s.plan.session_tasks)  # 5 session tasks ran, each once
        assert len(ran) == 5
        assert {n: s.state.counters[f"read:{n}"] for n in ("W0", "c0", "W1", "c1")} == dict.fromkeys(
            ("W0", "c0", "W1", "c1"), 1)
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)
    for y in later:
        assert np.array_equal(y, first)


def test_self_read_sequential_prepare(tmp_path):
    """The sequential reference path runs the same descriptors (no read task for a self-read source)."""
    with RuntimeSession(_two_gemms(tmp_path)) as s:
        s.prepare(sequential=True)
        assert all(s.store.state(r.key).value == "resident" for r in s.plan.requirements)
        y = s.run({"x": X})[0]
    with RuntimeSession(_two_gemms(tmp_path)) as s:
        assert np.array_equal(s.run({"x": X})[0], y)
