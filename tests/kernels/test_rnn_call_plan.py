"""The bound LSTM/GRU/RNN call's per-shape call plan (rnn._call_plan): once a float32 layer-0 call
without sequence_lens ran the checked path with read-only weights, later calls of that X shape pass the
settled arguments straight to the extension. Same values as the kernel function, for every op and
optional input, every dispatch level; anything the plan does not cover takes the checked path."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_prepared.bind import bind_node
from onnx_prepared.bind.kernel import specialize_constants
from onnx_prepared.kernels import native, rnn
from tests.kernels.test_rnn import _inputs

needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")
FNS = {"LSTM": rnn.lstm, "GRU": rnn.gru, "RNN": rnn.rnn}


def _bound(op: str, n_inputs: int, **attrs):
    node = helper.make_node(op, [f"i{i}" for i in range(n_inputs)], ["y", "h"] + (["c"] if op == "LSTM" else []),
                            **attrs)
    k = bind_node(node, {"": 14})
    return specialize_constants(k, {}, n_inputs).call


def _frozen(ins: list) -> list:
    out = []
    for i, v in enumerate(ins):
        if v is not None and i in (1, 2, 3, 7):  # weights, bias, peepholes: resident objects are read-only
            v = v.copy()
            v.flags.writeable = False
        out.append(v)
    return out


@needs_ext
@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("op", "init", "peep"), [("LSTM", True, True), ("LSTM", False, False), ("GRU", True, False),
                                                  ("GRU", False, False), ("RNN", True, False)])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_planned_calls_equal_the_kernel(level, op, init, peep, direction):
    ins = _frozen(_inputs(op, direction, init=init, peep=peep))
    attrs = {"hidden_size": ins[2].shape[-1], "direction": direction}
    call = _bound(op, len(ins), **attrs)
    with native.forced_level(level):
        ref = FNS[op](*ins, **attrs)
        for x in (ins[0], ins[0] * 0.5, np.asfortranarray(ins[0])):  # plan made, used; a strided X is copied
            args = [x, *ins[1:]]
            want = FNS[op](*args, **attrs) if x is not ins[0] else ref
            for _ in range(2):
                got = call(*args)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert g.dtype == np.float32 and g.flags.c_contiguous
                    np.testing.assert_array_equal(g, w)


@needs_ext
def test_states_passed_later_and_other_weights_take_the_checked_path():
    op = "LSTM"
    ins = _frozen(_inputs(op, "bidirectional", init=True, peep=True))
    attrs = {"hidden_size": ins[2].shape[-1], "direction": "bidirectional"}
    call = _bound(op, len(ins), **attrs)
    no_states = [*ins[:5], None, None, ins[7]]
    for args in (no_states, ins, no_states):  # the plan was made without initial states; states come later
        for g, w in zip(call(*args), FNS[op](*args, **attrs)):
            np.testing.assert_array_equal(g, w)
    other = _frozen(_inputs(op, "bidirectional", init=True, peep=True))  # new weight arrays, same shapes
    args = [ins[0], *other[1:]]
    for g, w in zip(call(*args), FNS[op](*args, **attrs)):
        np.testing.assert_array_equal(g, w)
    writeable = [ins[0], ins[1].copy(), *ins[2:]]  # a writeable W: never planned, read again every call
    first = call(*writeable)
    writeable[1] *= 0.5
    second = call(*writeable)
    assert not np.array_equal(first[0], second[0])
    for g, w in zip(second, FNS[op](*writeable, **attrs)):
        np.testing.assert_array_equal(g, w)


@needs_ext
def test_bad_states_and_sequence_lens_keep_their_checks():
    from onnx_prepared.errors import KernelError

    op = "GRU"
    ins = _frozen(_inputs(op, "forward", init=True))
    attrs = {"hidden_size": ins[2].shape[-1]}
    call = _bound(op, len(ins), **attrs)
    call(*ins)
    call(*ins)  # planned
    with pytest.raises(KernelError, match="initial_h"):
        call(*ins[:5], np.zeros((2, 4, 6), np.float32))
    lens = np.array([5, 3, 0, 1], np.int32)
    args = [*ins[:4], lens, ins[5]]
    for g, w in zip(call(*args), FNS[op](*args, **attrs)):
        np.testing.assert_array_equal(g, w)


def test_numpy_fallback_is_unchanged(monkeypatch):
    op = "LSTM"
    ins = _frozen(_inputs(op, "forward", init=True))
    attrs = {"hidden_size": ins[2].shape[-1]}
    call = _bound(op, len(ins), **attrs)
    if native.available():
        call(*ins)
        call(*ins)  # a plan exists; without the extension it must not be used
    monkeypatch.setattr(native, "_ext", None)
    for g, w in zip(call(*ins), FNS[op](*ins, **attrs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@needs_ext
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_a_repeated_call_takes_the_plan(op, monkeypatch):
    """The second call of an X shape with the same read-only weights skips the checked path (the plan
    was once stored under another key than the one looked up, so every call paid the checked path)."""
    ins = _frozen(_inputs(op, "bidirectional", init=True))
    attrs = {"hidden_size": ins[2].shape[-1], "direction": "bidirectional"}
    call = _bound(op, len(ins), **attrs)
    checked = []
    run_layer = rnn._run_layer
    monkeypatch.setattr(rnn, "_run_layer", lambda *a: checked.append(1) or run_layer(*a))
    first = call(*ins)
    second = call(*ins)
    assert len(checked) == 1
    for g, w in zip(second, first):
        np.testing.assert_array_equal(g, w)
