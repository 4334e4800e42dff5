"""The native driver of LSTM/GRU/RNN (rnn.py keeps the numpy path, used without the extension and for
float64): one extension call per layer (``native.rnn_layer``) that copies the initial states, computes
every direction's input projection and runs every recurrence. A layer too big for the extension's
plain projection loop gets its projection from BLAS first (one GEMM over all steps and directions). Y
and the final states come out in the ``[seq, dirs, batch, hidden]`` / ``[dirs, batch, hidden]`` layouts
the op returns."""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native

#: Multiply-adds of the input projection up to which the extension computes it (its loop beats a BLAS
#: call's fixed cost on small layers; BLAS is blocked and threaded for the large ones).
PROJECT_MACS = 1 << 21

_F32 = np.float32
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def usable(work_dtype) -> bool:
    return native.available() and work_dtype == np.float32


class Layer:
    """A layer's settled attributes (rnn.py builds one per geometry and attribute set) and rnn_layer's
    read-only configuration arrays per (seq, batch, projected here)."""

    __slots__ = ("clip", "codes", "configs", "directions", "input_forget", "linear_before_reset", "op")

    def __init__(self, op: str, directions: tuple[bool, ...], codes: tuple, clip: float | None, input_forget: int,
                 linear_before_reset: int) -> None:
        self.op = op
        self.directions = directions
        self.codes = codes  # per direction, the (code, alpha, beta) of each activation slot
        self.clip = clip
        self.input_forget = input_forget
        self.linear_before_reset = linear_before_reset
        self.configs: dict[tuple, tuple] = {}

    def config(self, seq: int, batch: int, hidden: int, inp: int, project: bool) -> tuple:
        """(cfg int32, fcfg float32, scratch bytes) of rnn_layer (see rnn_module.c) for this geometry."""
        key = (seq, batch, hidden, inp, project)
        hit = self.configs.get(key)
        if hit is not None:
            return hit
        nd = len(self.directions)
        acts = [list(d) + [(0, 0.0, 0.0)] * (3 - len(d)) for d in self.codes] + [[(0, 0.0, 0.0)] * 3] * (2 - nd)
        clip = self.clip
        cfg = np.array([native.RNN_KINDS[self.op], seq, batch, hidden, inp, nd,
                        sum(1 << d for d, r in enumerate(self.directions) if r), int(self.input_forget),
                        int(self.linear_before_reset), clip is not None] + [a[0] for d in acts for a in d], np.int32)
        fcfg = np.array([v for d in acts for v in [a[1] for a in d] + [a[2] for a in d]] +
                        [0.0 if clip is None else clip], np.float32)
        cfg.flags.writeable = fcfg.flags.writeable = False
        gates = _GATES[self.op]
        xw_bytes = (4 * seq * batch * nd * gates * hidden + 63) & ~63 if project else 0
        hit = (cfg, fcfg, xw_bytes + native._ext.rnn_scratch_bytes(batch, hidden, gates))
        if len(self.configs) >= 64:
            self.configs.clear()
        self.configs[key] = hit
        return hit


def run(layer: Layer, x: np.ndarray, wt: np.ndarray, rt: np.ndarray, bias: np.ndarray | None,
        lens: np.ndarray | None, init: list, *, p: np.ndarray | None = None,
        rbh: np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Y ``[seq, dirs, batch, hidden]`` and the final states (h, and c for LSTM), float32.

    ``wt`` is W transposed, C-contiguous ``[input, dirs * G * H]``; ``rt`` R transposed ``[dirs, H, G * H]``;
    ``bias`` the per-direction bias folded into the projection, flattened ``[dirs * G * H]``; ``p`` the LSTM
    peepholes ``[dirs, 3 * H]``; ``rbh`` the GRU's ``[dirs, H]`` recurrent h bias kept apart
    (linear_before_reset); all float32 (rnn.py derives them once per set of weights).
    """
    op = layer.op
    seq, batch, inp = x.shape
    nd, hidden = len(layer.directions), rt.shape[1]
    states = []
    for name, v in zip(("initial_h", "initial_c"), init):
        if v is not None:
            if v.shape != (nd, batch, hidden):
                raise KernelError(f"{op}: {name} of shape {list(v.shape)} must be {[nd, batch, hidden]}")
            v = np.ascontiguousarray(v, _F32)
        states.append(v)
    if wt.shape[0] != inp or rt.shape[0] != nd:
        raise KernelError(f"{op}: W/R hold {wt.shape[1] // rt.shape[2]}/{rt.shape[0]} directions, {nd} expected")
    x = np.ascontiguousarray(x, _F32)
    project = seq * batch * inp * wt.shape[1] <= PROJECT_MACS
    cfg, fcfg, nbytes = layer.config(seq, batch, hidden, inp, project)
    xw = None
    if not project:
        xw = np.matmul(x.reshape(seq * batch, inp), wt)
        if bias is not None:
            xw += bias
    h = np.empty((nd, batch, hidden), _F32)
    c = np.empty((nd, batch, hidden), _F32) if op == "LSTM" else None
    y = np.empty((seq, nd, batch, hidden), _F32)
    lens32 = None if lens is None else np.ascontiguousarray(lens, np.int32)
    native.rnn_layer(cfg, fcfg, x, wt, xw, bias, rt, states[0], states[1] if c is not None else None, lens32, p, rbh,
                     y, h, c, native._scratch(nbytes))
    return y, [h] if c is None else [h, c]
