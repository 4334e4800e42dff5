"""The native driver of LSTM/GRU/RNN (rnn.py keeps the numpy path, used without the extension and for
float64): every direction's input projection in one GEMM, then one extension call per direction that
runs the whole recurrence (``native.rnn_seq``). Y and the final states are written in place, in the
``[seq, dirs, batch, hidden]`` / ``[dirs, batch, hidden]`` layouts the op returns."""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native


def usable(work_dtype) -> bool:
    return native.available() and work_dtype == np.float32


def run(op: str, x: np.ndarray, w: np.ndarray, rt: np.ndarray, bias: np.ndarray | None, lens: np.ndarray | None,
        directions: tuple[bool, ...], init: list, acts: list[list[tuple[int, float, float]]], clip: float | None, *,
        p: np.ndarray | None = None, rbh: np.ndarray | None = None, input_forget: int = 0,
        linear_before_reset: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Y ``[seq, dirs, batch, hidden]`` and the final states (h, and c for LSTM), float32.

    ``rt`` is R transposed, C-contiguous ``[dirs, H, G * H]``; ``bias`` the per-direction bias folded into
    the projection, flattened ``[dirs * G * H]``; ``p`` the LSTM peepholes ``[dirs, 3 * H]``; ``rbh`` the
    GRU's ``[dirs, H]`` recurrent h bias kept apart (linear_before_reset); all float32 (rnn.py derives
    them once per set of weights).
    """
    seq, batch, _ = x.shape
    nd, gh, hidden = len(directions), w.shape[1], rt.shape[1]
    for name, v in zip(("initial_h", "initial_c"), init):
        if v is not None and v.shape != (nd, batch, hidden):
            raise KernelError(f"{op}: {name} of shape {list(v.shape)} must be {[nd, batch, hidden]}")
    if w.shape[0] != nd or rt.shape[0] != nd:
        raise KernelError(f"{op}: W/R hold {w.shape[0]}/{rt.shape[0]} directions, {nd} expected")
    xw = np.matmul(x.reshape(seq * batch, -1), w.reshape(nd * gh, -1).T).reshape(seq, batch, nd * gh)
    if bias is not None:
        xw += bias
    states = [np.zeros((nd, batch, hidden), np.float32) if v is None else np.array(v, np.float32, order="C")
              for v in init]  # copies: the extension updates them in place
    y = (np.empty if lens is None else np.zeros)((seq, nd, batch, hidden), np.float32)
    lens32 = None if lens is None else lens.astype(np.int32)
    for d, reverse in enumerate(directions):
        native.rnn_seq(op, xw, d * gh, rt[d], states[0][d], states[1][d] if op == "LSTM" else None, y,
                       d * batch * hidden, lens32, reverse=reverse, acts=acts[d], clip=clip,
                       p=None if p is None else p[d], rbh=None if rbh is None else rbh[d],
                       input_forget=input_forget, linear_before_reset=linear_before_reset)
    return y, states
