"""Prepared-execution semantics, proven with gates (events the test controls), never sleeps."""

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import Cancelled, KernelError
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.scheduler import HandleState
from tests.helpers.models import gemm_mlp, reference_mlp, save_external

X = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)


@pytest.fixture
def executed():
    """Records every action a traced session executes (``s.trace_actions(spy)``), with an event per action."""
    log, events = [], {}

    def spy(pc):
        log.append(pc)
        events.setdefault(pc, threading.Event()).set()

    def done(pc):
        return events.setdefault(pc, threading.Event())

    return log, done, spy


def test_a_node0_runs_before_weight1_finishes_loading(tmp_path, gated_reader, executed):
    log, done, spy = executed
    path = gemm_mlp(tmp_path, layers=2)
    gate = threading.Event()
    reader = gated_reader({"W1": gate})
    with RuntimeSession(path, reader=reader) as s, s.trace_actions(spy):
        h = s.run_async({"x": X})
        assert done(1).wait(20)  # Gemm 0 and Relu 0 executed ...
        assert reader.reads_of("W1") == 0  # ... while W1 is still being read
        assert not h.is_ready()
        gate.set()
        (y,) = h.result(timeout=20)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert log == [0, 1, 2, 3]


def test_b_concurrent_runs_share_resident_objects_and_own_outputs(tmp_path, gated_reader):
    path = gemm_mlp(tmp_path, layers=2)
    reader = gated_reader()
    x2 = X[::-1].copy()
    with RuntimeSession(path, reader=reader) as s:
        s.prepare()
        h1, h2 = s.run_async({"x": X}), s.run_async({"x": x2})
        (y1,), (y2,) = h1.result(timeout=20), h2.result(timeout=20)
        assert s.counters["hot_runs"] == 2
    np.testing.assert_allclose(y1, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, reference_mlp(path, x2), rtol=1e-5, atol=1e-6)
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    assert all(reader.reads_of(n) == 1 for n in ("W0", "W1", "c0", "c1"))


def test_shared_in_flight_load_one_read_one_prepack(tmp_path, gated_reader):
    path = gemm_mlp(tmp_path, layers=2)
    gate = threading.Event()
    reader = gated_reader({"W0": gate})
    with RuntimeSession(path, reader=reader) as s:
        hp = s.prepare_async()
        h1, h2 = s.run_async({"x": X}), s.run_async({"x": X})  # two more consumers of every key
        gate.set()
        y1, y2 = h1.result(timeout=20)[0], h2.result(timeout=20)[0]
        hp.wait(timeout=20)
        counts = s.state.counters
    np.testing.assert_array_equal(y1, y2)
    assert reader.reads_of("W0") == 1
    assert sorted(v for k, v in counts.items() if k.startswith("prepack:")) == [1, 1]


def test_c_initialization_failure_fails_only_its_consumers_then_retries(tmp_path, gated_reader):
    path = gemm_mlp(tmp_path, layers=2)
    reader = gated_reader(fail_once={"W1"})
    with RuntimeSession(path, reader=reader) as s:
        hp = s.prepare_async()
        with pytest.raises(OSError, match="W1"):
            hp.wait(timeout=20)
        states = {str(k): v.value for k, v in s.store.states().items()}
        assert [v for k, v in states.items() if k.startswith("W1@")] == ["failed"]
        assert [v for k, v in states.items() if k.startswith("W0@")] == ["resident"]  # independent work done
        (y,) = s.run({"x": X})  # a later run retries W1 in a new generation
        w1 = next(k for k in s.store.states() if str(k).startswith("W1@"))
        assert s.store.entry(w1).generation == 2
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_c_run_needing_failed_object_fails_with_the_read_error(tmp_path, gated_reader):
    path = gemm_mlp(tmp_path, layers=2)
    reader = gated_reader(fail_once={"W1"})
    with RuntimeSession(path, reader=reader) as s:
        h = s.run_async({"x": X})
        with pytest.raises(OSError, match="injected read failure of W1"):
            h.result(timeout=20)
        assert h.status is HandleState.FAILED
        np.testing.assert_allclose(s.run({"x": X})[0], reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def _gather_model(folder):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Gather", ["h", "idx"], ["y"], name="pick", axis=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
              helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w])
    return save_external(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), folder)


def test_d_failing_node_fails_its_run_only(tmp_path):
    path = _gather_model(tmp_path)
    x = np.ones((2, 4), np.float32)
    with RuntimeSession(path) as s:
        bad = s.run_async({"x": x, "idx": np.array([0, 99], np.int64)})
        good = s.run_async({"x": x, "idx": np.array([0, 5], np.int64)})
        with pytest.raises(KernelError, match="pick"):
            bad.result(timeout=20)
        (y,) = good.result(timeout=20)
        w = onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0])
        np.testing.assert_allclose(y, (x @ w)[:, [0, 5]], rtol=1e-6)
        assert bad.diagnostics.failing_task is not None


def test_e_cancel_releases_pins_and_leaves_shared_preparation(tmp_path, gated_reader, executed):
    log, done, spy = executed
    # Layers 0 and 2 share one prepacked W0 (transB 0), so a run pins it from action 0 to action 4;
    # layer 1's bias c1 is gated, so both runs wait at action 2 while holding that pin.
    path = gemm_mlp(tmp_path, layers=3, share_b=True)
    gate = threading.Event()
    reader = gated_reader({"c1": gate})
    with RuntimeSession(path, reader=reader) as s, s.trace_actions(spy):
        h1 = s.run_async({"x": X})
        h2 = s.run_async({"x": X})
        assert reader.started["c1"].wait(20)
        while sum(1 for pc in log if pc == 1) < 2:  # both runs executed layer 0
            assert done(1).wait(20)
            done(1).clear()
        shared = next(k for k in s.store.states() if "transB0" in k.layout)
        assert s.store.entry(shared).pins == 2
        h1.cancel()
        with pytest.raises(Cancelled):
            h1.wait(timeout=20)
        assert s.store.entry(shared).pins == 1  # the cancelled run released its pin
        gate.set()
        (y,) = h2.result(timeout=20)
        assert s.store.entry(shared).pins == 0
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)
    assert reader.reads_of("c1") == 1  # the shared read was not cancelled with run 1


def test_f_run_equals_run_async_result(tmp_path):
    path = _gather_model(tmp_path)
    x = np.ones((2, 4), np.float32)
    with RuntimeSession(path) as a, RuntimeSession(path) as b:
        ya = a.run({"x": x, "idx": np.array([1, 2], np.int64)})
        yb = b.run_async({"x": x, "idx": np.array([1, 2], np.int64)}).result(timeout=20)
        np.testing.assert_array_equal(ya[0], yb[0])
        errs = []
        for call in (lambda: a.run({"x": x, "idx": np.array([7, 99], np.int64)}),
                     lambda: b.run_async({"x": x, "idx": np.array([7, 99], np.int64)}).result(timeout=20)):
            with pytest.raises(KernelError) as e:
                call()
            errs.append(str(e.value))
        assert errs[0] == errs[1]
        assert a.arenas.snapshot() == b.arenas.snapshot()


def test_g_run_async_before_any_read_returns_at_once(tmp_path, gated_reader):
    path = gemm_mlp(tmp_path, layers=2)
    gate = threading.Event()
    reader = gated_reader(dict.fromkeys(["W0", "W1", "c0", "c1"], gate))
    with RuntimeSession(path, reader=reader) as s:
        h = s.run_async({"x": X})
        assert not h.is_ready() and reader.bytes_read == 0
        gate.set()
        (y,) = h.result(timeout=20)
    np.testing.assert_allclose(y, reference_mlp(path, X), rtol=1e-5, atol=1e-6)


def test_hot_path_dispatches_one_task_and_touches_no_per_node_state(tmp_path):
    path = gemm_mlp(tmp_path, layers=3)
    with RuntimeSession(path, {"trace": True}) as s:
        s.prepare()
        claims = s.store.counters["claims"]
        n0 = len(s.scheduler.trace.records())
        for _ in range(5):
            s.run({"x": X})
        assert s.counters["hot_runs"] == 5 and s.counters["cold_runs"] == 0 and s.counters["yields"] == 0
        assert s.store.counters["claims"] == claims  # no per-node readiness lookup or claim
        new = s.scheduler.trace.records()[n0:]
        assert [r.name for r in new] == [f"I.run-{i}" for i in range(1, 6)]  # one task per run, not per node
        assert s.store.leases == 0


def test_sequential_reference_path_runs_the_same_session_tasks(tmp_path, gated_reader):
    path = gemm_mlp(tmp_path, layers=3, share_b=True)
    ra, rb = gated_reader(), gated_reader()
    with RuntimeSession(path, reader=ra) as a, RuntimeSession(path, reader=rb) as b:
        a.prepare(sequential=True)
        b.prepare()
        assert a.state.counters == b.state.counters  # same reads, same prepacks, once each
        assert a.store.all_resident and b.store.all_resident
        np.testing.assert_array_equal(a.run({"x": X})[0], b.run({"x": X})[0])
        assert a.counters["hot_runs"] == 1
    assert sorted(ra.log) == sorted(rb.log)


def test_run_async_starts_every_producer_at_submission(tmp_path, gated_reader):
    """Overlap: W1 is read while the run still waits for W0, not when the run reaches layer 1."""
    path = gemm_mlp(tmp_path, layers=2)
    gate0, gate1 = threading.Event(), threading.Event()
    reader = gated_reader({"W0": gate0, "W1": gate1})
    with RuntimeSession(path, reader=reader) as s:
        h = s.run_async({"x": X})
        assert reader.started["W1"].wait(20)  # W1's read began although W0 is still held back
        assert not h.is_ready()
        gate0.set()
        gate1.set()
        np.testing.assert_allclose(h.result(timeout=20)[0], reference_mlp(path, X), rtol=1e-5, atol=1e-6)
