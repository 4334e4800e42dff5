"""cancel() reaches a Loop with a huge trip count: checked between iterations, gated (no sleeps)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared import RuntimeSession
from onnx_prepared.bind import control_flow
from onnx_prepared.bind import graph as bind_graph
from onnx_prepared.errors import Cancelled

BOUND = 30.0  # seconds: far above any real run of this model, so only a hang reaches it


def _huge_loop(path):
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    loop = helper.make_node("Loop", ["M", "cond", "v0"], ["v"], body=body)
    g = helper.make_graph([loop], "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])],
                          [helper.make_tensor("M", TensorProto.INT64, [], [10**15]),
                           helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    p = str(path / "loop.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


@pytest.mark.parametrize("opts", [{}, {"trace": True}], ids=["default-scheduler", "own-scheduler"])
def test_cancel_reaches_a_loop_with_a_huge_trip_count(tmp_path, monkeypatch, opts):
    started = threading.Event()
    real = bind_graph.checkpoint  # called once per body evaluation (by the body's runner or by Loop itself)
    calls = [0]

    def counted():
        calls[0] += 1
        if calls[0] == 50:
            started.set()  # the loop is iterating
        real()

    monkeypatch.setattr(bind_graph, "checkpoint", counted)
    monkeypatch.setattr(control_flow, "checkpoint", counted)
    with RuntimeSession(_huge_loop(tmp_path), opts) as s:
        h = s.run_async({"v0": np.zeros(1, np.float32)})
        assert started.wait(BOUND), "the loop never started"
        h.cancel()
        with pytest.raises(Cancelled):
            h.result(timeout=BOUND)  # a TimeoutError here is the hang this test exists for
    assert calls[0] < 10**15
