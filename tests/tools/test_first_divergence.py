"""tools/first_divergence.py: nothing to report on a model both runtimes compute alike; the first node
whose output differs when ours is skewed (a monkeypatched run adds 1 to one node output)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "first_divergence.py")


def _tool():
    spec = importlib.util.spec_from_file_location("first_divergence", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")]
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]),
              path)
    feeds = str(tmp_path / "f.npz")
    np.savez(feeds, x=np.array([-1.0, 0.5, 2.0, -3.0], np.float32))
    return path, feeds


def test_no_divergence(tmp_path, capsys):
    path, feeds = _model(tmp_path)
    assert _tool().main([path, feeds]) == 0
    assert "no divergence over 2 node outputs" in capsys.readouterr().out


def test_the_first_divergent_node_is_named(tmp_path, capsys, monkeypatch):
    from onnx_prepared import InferenceSession

    path, feeds = _model(tmp_path)
    run = InferenceSession.run

    def skewed(self, names, inputs, *a, **k):  # our 'r' (the Relu's output) one unit off
        outs = run(self, names, inputs, *a, **k)
        at = [o.name for o in self.get_outputs()].index("r")
        outs[at] = outs[at] + 1
        return outs

    monkeypatch.setattr(InferenceSession, "run", skewed)
    assert _tool().main([path, feeds]) == 1
    out = capsys.readouterr().out
    assert "first divergence: Relu 'relu' output 'r'" in out and "4 of 4 elements" in out
