"""LSTM / GRU / RNN kernels against onnxruntime: directions, initial states, sequence_lens (padded
steps), peepholes, clip, activations with alpha/beta, GRU linear_before_reset, LSTM input_forget, layout."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _rnn_native, native
from tests.kernels.onnx_node_check import check, check_ort, run_ours

RNG = np.random.default_rng(3)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _inputs(op, direction, *, seq=5, batch=4, inp=3, hidden=6, lens=None, init=False, bias=True, peep=False,
            layout=0, dtype=np.float32, rng=None):
    nd, g = DIRS[direction], GATES[op]
    rng = RNG if rng is None else rng  # the module's generator unless a test brings its own
    x = rng.standard_normal((batch, seq, inp) if layout else (seq, batch, inp)).astype(dtype)
    # weights scaled like a trained net's (~1/sqrt(fan-in)): a chaotic RNN would amplify rounding differences
    w = (rng.standard_normal((nd, g * hidden, inp)) * min(0.5, 1.5 / np.sqrt(inp))).astype(dtype)
    r = (rng.standard_normal((nd, g * hidden, hidden)) * min(0.5, 1.5 / np.sqrt(hidden))).astype(dtype)
    hs = (batch, nd, hidden) if layout else (nd, batch, hidden)
    ins = [x, w, r, rng.standard_normal((nd, 2 * g * hidden)).astype(dtype) if bias else None,
           None if lens is None else np.array(lens, np.int32), rng.standard_normal(hs).astype(dtype) if init else None]
    if op == "LSTM":
        ins.append(rng.standard_normal(hs).astype(dtype) if init else None)
        ins.append(rng.standard_normal((nd, 3 * hidden)).astype(dtype) if peep else None)
    while ins[-1] is None:
        ins.pop()
    return ins


def _check(op, ins, direction, opset=14, **attrs):
    n_out = 3 if op == "LSTM" else 2
    return check_ort(op, ins, opset=opset, n_outputs=n_out, hidden_size=ins[2].shape[-1], direction=direction,
                     **attrs)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", [None, [5, 5, 5, 5], [5, 3, 0, 1]])
@pytest.mark.parametrize("init", [False, True])
def test_directions_lengths_and_initial_state(op, direction, lens, init):
    _check(op, _inputs(op, direction, lens=lens, init=init), direction)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout_1_against_reference(op):
    """onnxruntime's CPU recurrent ops reject layout=1; onnx.reference's is the oracle (full-length sequences)."""
    ins = _inputs(op, "bidirectional", init=True, layout=1)
    check(op, ins, opset=14, n_outputs=3 if op == "LSTM" else 2, rtol=1e-4, atol=1e-5, hidden_size=6,
          direction="bidirectional", layout=1)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout_1_is_layout_0_transposed_with_lengths(op):
    ins0 = _inputs(op, "bidirectional", init=True, lens=[5, 2, 0, 4])
    ins1 = [v if v is None or i in (1, 2, 3, 4) or (op == "LSTM" and i == 7) else
            (v.transpose(1, 0, 2) if v.ndim == 3 else v) for i, v in enumerate(ins0)]
    n = 3 if op == "LSTM" else 2
    out0 = run_ours(op, ins0, opset=14, n_outputs=n, hidden_size=6, direction="bidirectional")
    out1 = run_ours(op, ins1, opset=14, n_outputs=n, hidden_size=6, direction="bidirectional", layout=1)
    np.testing.assert_array_equal(out1[0], out0[0].transpose(2, 0, 1, 3))
    for a, b in zip(out1[1:], out0[1:]):
        np.testing.assert_array_equal(a, b.transpose(1, 0, 2))


@pytest.mark.parametrize(
    ("op", "attrs", "extra"),
    [
        ("LSTM", {}, {"peep": True, "lens": [5, 2, 1, 4], "init": True}),
        ("LSTM", {"clip": 0.5}, {"peep": True, "init": True}),
        ("LSTM", {"clip": 0.5}, {"init": True}),
        ("LSTM", {"input_forget": 1}, {"init": True}),
        ("GRU", {"linear_before_reset": 1}, {"lens": [5, 2, 1, 4], "init": True}),
        ("GRU", {"linear_before_reset": 1, "clip": 0.3}, {"init": True}),
        ("GRU", {"clip": 0.3}, {"init": True}),
        ("GRU", {}, {"bias": False}),
        ("RNN", {"activations": ["Relu"]}, {"init": True}),
        ("RNN", {"clip": 0.2}, {"init": True}),
        ("GRU", {"activations": ["HardSigmoid", "Affine"], "activation_alpha": [0.3, 0.7],
                 "activation_beta": [0.4, 0.1]}, {"init": True}),
        ("LSTM", {"activations": ["Sigmoid", "ScaledTanh", "Elu"], "activation_alpha": [0.8, 0.6],
                  "activation_beta": [1.2]}, {"init": True}),
        ("LSTM", {"activations": ["Softsign", "Softplus", "ThresholdedRelu"], "activation_alpha": [0.1]}, {}),
    ],
)
def test_gate_options(op, attrs, extra):
    _check(op, _inputs(op, "forward", **extra), "forward", **attrs)


def test_bidirectional_activations_per_direction():
    attrs = {"activations": ["LeakyRelu", "HardSigmoid"], "activation_alpha": [0.1, 0.3], "activation_beta": [0.4]}
    _check("RNN", _inputs("RNN", "bidirectional", init=True), "bidirectional", **attrs)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("opset", [7, 14])
def test_realistic_sizes(op, opset):
    ins = _inputs(op, "bidirectional", seq=50, batch=2, inp=40, hidden=64, init=True)
    _check(op, ins, "bidirectional", opset=opset)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float64_against_reference(op):
    """onnxruntime has no double GRU; onnx.reference has no sequence_lens: full-length sequences."""
    ins = _inputs(op, "forward", init=True, dtype=np.float64)
    (y, *_) = check(op, ins, opset=14, n_outputs=3 if op == "LSTM" else 2, rtol=1e-9, atol=1e-9, hidden_size=6)
    assert y.dtype == np.float64


def test_float16_computes_in_float32():
    ins = _inputs("LSTM", "forward", init=True, dtype=np.float16)
    ours = run_ours("LSTM", ins, opset=14, n_outputs=3, hidden_size=6)
    ref = run_ours("LSTM", [None if v is None else v.astype(np.float32) for v in ins], opset=14, n_outputs=3,
                   hidden_size=6)
    for a, b in zip(ours, ref):
        assert a.dtype == np.float16
        np.testing.assert_array_equal(a, b.astype(np.float16))


def test_bad_sequence_lens_is_a_clear_error():
    with pytest.raises(KernelError, match="sequence_lens"):
        run_ours("GRU", _inputs("GRU", "forward", lens=[6, 1, 1, 1]), opset=14, n_outputs=2, hidden_size=6)


# **** the native recurrence (rnn_step.inc): every dispatch level, and the numpy path as its oracle ****

needs_ext = pytest.mark.skipif(not native.available(), reason="native extension not built")
OPTION_CASES = [
    ("LSTM", {"clip": 0.7, "input_forget": 1}, {"peep": True}),
    ("LSTM", {"activations": ["HardSigmoid", "LeakyRelu", "Softplus"] * 2, "activation_alpha": [0.3, 0.2, 0.3, 0.2],
              "activation_beta": [0.4, 0.4]}, {"peep": True}),
    ("GRU", {"linear_before_reset": 1, "clip": 0.9}, {}),
    ("GRU", {"activations": ["Sigmoid", "Softsign", "HardSigmoid", "Elu"], "activation_alpha": [0.2, 0.5]}, {}),
    ("RNN", {"activations": ["ThresholdedRelu", "Relu"], "activation_alpha": [0.1], "clip": 2.0}, {}),
    ("RNN", {"activations": ["ScaledTanh", "Affine"], "activation_alpha": [0.9, 0.6],
             "activation_beta": [1.1, 0.2]}, {}),
]


@needs_ext
@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_native_at_every_dispatch_level_matches_onnxruntime(level, op):
    with native.forced_level(level):
        _check(op, _inputs(op, "bidirectional", lens=[5, 3, 0, 1], init=True, peep=op == "LSTM"), "bidirectional")
        _check(op, _inputs(op, "reverse", seq=30, batch=3, inp=20, hidden=37, init=True), "reverse")


@needs_ext
@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("op", "attrs", "extra"), OPTION_CASES)
def test_native_equals_the_numpy_path(level, op, attrs, extra, monkeypatch):
    ins = _inputs(op, "bidirectional", lens=[5, 2, 0, 4], init=True, **extra)
    kept = [None if v is None else v.copy() for v in ins]
    n = 3 if op == "LSTM" else 2
    with native.forced_level(level):
        fast = run_ours(op, ins, opset=14, n_outputs=n, hidden_size=6, direction="bidirectional", **attrs)
    for a, b in zip(ins, kept):
        assert (a is None and b is None) or np.array_equal(a, b)  # inputs (initial states) untouched
    monkeypatch.setattr(_rnn_native, "usable", lambda wd: False)
    slow = run_ours(op, ins, opset=14, n_outputs=n, hidden_size=6, direction="bidirectional", **attrs)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not native.available(), reason="native extension not built")
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_weights_are_derived_once_when_read_only_and_again_when_writeable(op):
    """Resident weights are read-only: their native form (R^T, folded bias) is derived once and reused;
    a writeable array (a feed the caller may change in place) is derived again on every call."""
    from onnx_prepared.kernels import rnn

    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    ins = _inputs(op, "bidirectional", init=True, peep=op == "LSTM")
    fn = {"LSTM": rnn.lstm, "GRU": rnn.gru, "RNN": rnn.rnn}[op]
    fresh = fn(*ins, direction="bidirectional", **attrs)
    frozen = [v if v is None or i not in (1, 2, 3, 7) else v.copy() for i, v in enumerate(ins)]
    for v in frozen[1:4]:
        v.flags.writeable = False
    rnn._NATIVE_WEIGHTS.clear()
    first = fn(*frozen, direction="bidirectional", **attrs)
    assert len(rnn._NATIVE_WEIGHTS) == (0 if op == "LSTM" else 1)  # LSTM's P (writeable) opts out
    if op == "LSTM":
        frozen[7] = frozen[7].copy()
        frozen[7].flags.writeable = False
        first = fn(*frozen, direction="bidirectional", **attrs)
        assert len(rnn._NATIVE_WEIGHTS) == 1
    again = fn(*frozen, direction="bidirectional", **attrs)
    assert len(rnn._NATIVE_WEIGHTS) == 1
    for a, b, c in zip(fresh, first, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    ins[2] *= 0.5  # a writeable R changed in place: the next call sees the new values
    changed = fn(*ins, direction="bidirectional", **attrs)
    assert len(rnn._NATIVE_WEIGHTS) == 1 and not np.array_equal(changed[0], fresh[0])


@needs_ext
@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_native_activations_saturate_and_propagate_nan_like_the_numpy_path(level, op, monkeypatch):
    """The recurrence's own exp (vectorized, ~2e-7 relative) at the extremes: gates saturate to exactly
    0/1 and tanh to +-1 for huge pre-activations, NaN stays NaN, as numpy's sigmoid/tanh do.

    The inputs come from the test's own generator: drawn from the module's, they depended on which tests
    ran before on the worker. Elsewhere the two exps' differences grow through the recurrence near
    saturation: up to 5.0e-5 (LSTM), 8.4e-6 (GRU) over 150 seeds, hence the tolerance."""
    ins = _inputs(op, "bidirectional", seq=4, batch=3, init=True, rng=np.random.default_rng(20261202))
    ins[0][0, 0] = 1e4
    ins[0][1, 1] = -1e4
    ins[0][2, 2, 0] = np.nan
    n = 3 if op == "LSTM" else 2
    with native.forced_level(level):
        fast = run_ours(op, ins, opset=14, n_outputs=n, hidden_size=6, direction="bidirectional")
    monkeypatch.setattr(_rnn_native, "usable", lambda wd: False)
    with np.errstate(all="ignore"):
        slow = run_ours(op, ins, opset=14, n_outputs=n, hidden_size=6, direction="bidirectional")
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@needs_ext
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_native_projection_by_blas_equals_the_extensions(op, monkeypatch):
    """Small layers get their input projection from the extension's loop, large ones from BLAS first
    (``_rnn_native.PROJECT_MACS``): both give onnxruntime's values."""
    ins = _inputs(op, "bidirectional", lens=[5, 2, 0, 4], init=True, peep=op == "LSTM")
    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    monkeypatch.setattr(_rnn_native, "PROJECT_MACS", 0)
    _check(op, ins, "bidirectional", **attrs)
    monkeypatch.setattr(_rnn_native, "PROJECT_MACS", 1 << 40)
    _check(op, ins, "bidirectional", **attrs)


@needs_ext
def test_rnn_layer_rejects_bad_buffers():
    from onnx_prepared.kernels import rnn

    layer = rnn._native_spec("RNN", (3, 2, 4), (1, 4, 4), (1, 4, 4), 0, "forward", None, None, None, None, None, 0, 0)
    cfg, fcfg, nbytes = layer.config(3, 2, 4, 4, True)
    x, wt, rt = np.zeros((3, 2, 4), np.float32), np.zeros((4, 4), np.float32), np.zeros((1, 4, 4), np.float32)
    h, y = np.zeros((1, 2, 4), np.float32), np.zeros((3, 1, 2, 4), np.float32)
    scratch = np.zeros(nbytes, np.uint8)
    with pytest.raises(ValueError, match="wt holds"):
        native.rnn_layer(cfg, fcfg, x, wt[:3], None, None, rt, None, None, None, None, None, y, h, None, scratch)
    with pytest.raises(ValueError, match="y holds"):
        native.rnn_layer(cfg, fcfg, x, wt, None, None, rt, None, None, None, None, None, y[:2], h, None, scratch)
    with pytest.raises(ValueError, match="lens"):
        native.rnn_layer(cfg, fcfg, x, wt, None, None, rt, None, None, np.array([4, 1], np.int32), None, None, y, h,
                         None, scratch)
    with pytest.raises(ValueError, match="scratch holds"):
        native.rnn_layer(cfg, fcfg, x, wt, None, None, rt, None, None, None, None, None, y, h, None, scratch[:8])
