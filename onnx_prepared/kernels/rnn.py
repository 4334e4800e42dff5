"""LSTM, GRU and RNN: the input projection of every time step in one GEMM, then one small GEMM and a
few in-place elementwise ops per step.

Conventions are onnxruntime's: with ``sequence_lens`` a batch entry stops at its length (its Y steps
past the end are zeros, Y_h/Y_c hold the state at its last valid step, zeros for a zero length), and
the reverse direction of a short entry starts at its own last valid step. ``layout=1`` (opset 14) is batch-major for X,
initial states, Y and Y_h/Y_c. Half-precision inputs compute in float32.
"""

from __future__ import annotations

import functools

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import _rnn_native, native
from onnx_prepared.kernels import _spatial as sp
from onnx_prepared.kernels.native import RNN_ACTIVATIONS
from onnx_prepared.kernels.registry import kernel, specializes

# **** activations ****


def _sigmoid(x, alpha, beta):
    # 0.5 * tanh(x / 2) + 0.5: one transcendental, no overflow warning for large |x|
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5
    return x


def _tanh(x, alpha, beta):
    return np.tanh(x, out=x)


def _relu(x, alpha, beta):
    return np.maximum(x, 0, out=x)


def _affine(x, alpha, beta):
    x *= alpha
    x += beta
    return x


def _leaky_relu(x, alpha, beta):
    return np.where(x >= 0, x, x * alpha).astype(x.dtype, copy=False)


def _thresholded_relu(x, alpha, beta):
    return np.where(x > alpha, x, 0).astype(x.dtype, copy=False)


def _scaled_tanh(x, alpha, beta):
    return (alpha * np.tanh(beta * x)).astype(x.dtype, copy=False)


def _hard_sigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0, 1).astype(x.dtype, copy=False)


def _elu(x, alpha, beta):
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0))).astype(x.dtype, copy=False)


def _softsign(x, alpha, beta):
    return (x / (1 + np.abs(x))).astype(x.dtype, copy=False)


def _softplus(x, alpha, beta):
    return np.logaddexp(x, 0).astype(x.dtype, copy=False)


# name -> (function, uses alpha, default alpha, uses beta, default beta)
_ACTIVATIONS = {
    "sigmoid": (_sigmoid, False, 0.0, False, 0.0), "tanh": (_tanh, False, 0.0, False, 0.0),
    "relu": (_relu, False, 0.0, False, 0.0), "affine": (_affine, True, 1.0, True, 0.0),
    "leakyrelu": (_leaky_relu, True, 0.01, False, 0.0), "thresholdedrelu": (_thresholded_relu, True, 1.0, False, 0.0),
    "scaledtanh": (_scaled_tanh, True, 1.0, True, 1.0), "hardsigmoid": (_hard_sigmoid, True, 0.2, True, 0.5),
    "elu": (_elu, True, 1.0, False, 0.0), "softsign": (_softsign, False, 0.0, False, 0.0),
    "softplus": (_softplus, False, 0.0, False, 0.0),
}


_F32 = np.dtype(np.float32)

#: bound activation function -> the native extension's activation code
_CODES = {spec[0]: RNN_ACTIVATIONS.index(name) for name, spec in _ACTIVATIONS.items()}


def _codes(acts: list[list]) -> tuple[tuple[tuple[int, float, float], ...], ...]:
    return tuple(tuple((_CODES[fn], a, b) for fn, a, b in d) for d in acts)


#: (op, ids of W, R, B, P, linear_before_reset) -> (W, R, B, P, their native form): see _native_weights
_NATIVE_WEIGHTS: dict[tuple, tuple] = {}


def _native_weights(op: str, W, R, B, P, n_dir: int, hs: int, linear_before_reset: int = 0) -> tuple:
    """(bias, p, rbh, R^T, W^T) as the native driver takes them, derived from the weights once.

    Memoized only when every weight is a read-only array (resident prepared objects are; a writeable
    feed may change in place between runs, so it is derived again); entries keep their weights alive
    and are checked by identity, so an id is never mistaken for another array's.
    """
    ws = (W, R, B, P)
    key = (op, id(W), id(R), id(B), id(P), linear_before_reset)
    hit = _NATIVE_WEIGHTS.get(key)
    frozen = all(v is None or (type(v) is np.ndarray and not v.flags.writeable) for v in ws)
    if frozen and hit is not None and hit[0] is W and hit[1] is R and hit[2] is B and hit[3] is P:
        return hit[4]
    if not frozen:
        key = None
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    b = None if B is None else B.astype(np.float32, copy=False)
    rbh = None
    if op == "GRU":
        parts = [_gru_bias(b, d, hs, linear_before_reset) for d in range(n_dir)]
        bias = None if b is None else np.concatenate([bs for bs, _ in parts])
        rbh = None if b is None or not linear_before_reset else np.stack([rb for _, rb in parts])
    else:
        bias = None if b is None else np.concatenate([_bias(b, d, gates, hs)[0] for d in range(n_dir)])
    p = None if P is None else np.ascontiguousarray(P.astype(np.float32, copy=False).reshape(n_dir, 3 * hs))
    rt = np.ascontiguousarray(R.astype(np.float32, copy=False).transpose(0, 2, 1))
    wt = np.ascontiguousarray(W.astype(np.float32, copy=False).reshape(n_dir * W.shape[1], W.shape[2]).T)
    out = (bias, p, None if rbh is None else np.ascontiguousarray(rbh), rt, wt)
    if key is not None:
        if len(_NATIVE_WEIGHTS) >= 64:
            _NATIVE_WEIGHTS.clear()
        _NATIVE_WEIGHTS[key] = (*ws, out)
    return out


def _activations(op: str, names, alphas, betas, defaults: tuple[str, ...], n_dir: int) -> list[list]:
    """Per direction, the bound activation functions (alpha/beta consumed in order by those that use them)."""
    return _bound_activations(op, tuple(names or ()), tuple(alphas or ()), tuple(betas or ()), defaults, n_dir)


@functools.lru_cache(maxsize=256)
def _bound_activations(op: str, names, alphas, betas, defaults: tuple[str, ...], n_dir: int) -> list[list]:
    # NOTE: memoized (a node's attributes are the same every run); callers never mutate the lists
    names = list(names) if names else list(defaults) * n_dir
    n = len(defaults)
    if len(names) == n and n_dir == 2:
        names = names * 2
    if len(names) != n * n_dir:
        raise KernelError(f"{op}: {len(names)} activations given, {n * n_dir} expected ({n} per direction)")
    alphas, betas = list(alphas or []), list(betas or [])
    ia = ib = 0
    bound = []
    for name in names:
        try:
            fn, ua, da, ub, db = _ACTIVATIONS[name.lower()]
        except KeyError:
            raise KernelError(f"{op}: unknown activation {name!r}; known: {sorted(_ACTIVATIONS)}") from None
        a, b = da, db
        if ua and ia < len(alphas):
            a, ia = alphas[ia], ia + 1
        if ub and ib < len(betas):
            b, ib = betas[ib], ib + 1
        bound.append((fn, a, b))
    return [bound[d * n:(d + 1) * n] for d in range(n_dir)]


# **** the native driver ****


def _native_layer(op: str, X, W, R, B, P, sequence_lens, init: list, *, layout: int, direction: str, activations,
                  activation_alpha, activation_beta, clip, hidden_size, input_forget: int = 0,
                  linear_before_reset: int = 0) -> tuple:
    """A float32 layer on the extension, in one call (_rnn_native.run). What depends only on shapes and
    attributes (checks, directions, activation codes) is settled once (_native_spec), what depends on
    the weights once per set of read-only weights (_native_weights): a run pays the call and little else."""
    layer = _native_spec(op, X.shape, W.shape, R.shape, layout, direction, _tuple(activations),
                         _tuple(activation_alpha), _tuple(activation_beta), hidden_size, clip, input_forget,
                         linear_before_reset)
    return _run_layer(layer, X, W, R, B, P, sequence_lens, init, layout)


def _run_layer(layer: _rnn_native.Layer, X, W, R, B, P, sequence_lens, init: list, layout: int) -> tuple:
    op = layer.op
    x = X
    if layout:
        x = X.transpose(1, 0, 2)
        init = [None if v is None else v.transpose(1, 0, 2) for v in init]
    lens = None if sequence_lens is None else _lengths(sequence_lens, x.shape[0], x.shape[1], op)
    bias, p, rbh, rt, wt = _native_weights(op, W, R, B, P, len(layer.directions), R.shape[-1],
                                           layer.linear_before_reset)
    y, states = _rnn_native.run(layer, x, wt, rt, bias, lens, init, p=p, rbh=rbh)
    if layout or X.dtype != _F32:
        return _outputs([y, *states], layout, X.dtype)
    return (y, *states)


def _tuple(v) -> tuple | None:
    return None if v is None else tuple(v)


def _specialized(op: str, fn, attrs: dict):
    """The node's call with its attributes settled at binding: float32 layers go to the native driver
    with the settled layer per input geometry (no keyword merge, no attribute hashing per call); anything
    else (another dtype, no extension) calls the kernel itself."""
    layout = attrs.get("layout", 0)
    spec_args = (layout, attrs.get("direction", "forward"), _tuple(attrs.get("activations")),
                 _tuple(attrs.get("activation_alpha")), _tuple(attrs.get("activation_beta")),
                 attrs.get("hidden_size"), attrs.get("clip"), attrs.get("input_forget", 0),
                 attrs.get("linear_before_reset", 0))
    layers: dict[tuple, _rnn_native.Layer] = {}
    lstm_ = op == "LSTM"
    plans: dict[tuple, tuple | None] = {}  # X shape -> see _call_plan (None: that shape stays checked)
    plannable = not layout

    def rnn_layer(X, W, R, B=None, sequence_lens=None, initial_h=None, *rest):
        if X.dtype != _F32 or not _rnn_native.usable(_F32):
            return fn(X, W, R, B, sequence_lens, initial_h, *rest, **attrs)
        c0 = rest[0] if lstm_ and rest else None
        P = rest[1] if lstm_ and len(rest) > 1 else None
        if plannable and sequence_lens is None:
            plan = plans.get(X.shape)
            if (plan is not None and plan[0] is W and plan[1] is R and plan[2] is B and plan[3] is P
                    and (initial_h is None or _state_ok(initial_h, plan[5]))
                    and (c0 is None or _state_ok(c0, plan[5]))):
                if not X.flags.c_contiguous:
                    X = np.ascontiguousarray(X)
                cfg, fcfg, nbytes, wt, bias, rt, p, rbh = plan[4]
                y = np.empty(plan[6], _F32)
                h = np.empty(plan[5], _F32)
                c = np.empty(plan[5], _F32) if lstm_ else None
                native._ext.rnn_layer(cfg, fcfg, X, wt, None, bias, rt, initial_h, c0, None, p, rbh, y, h, c,
                                      native._scratch(nbytes))
                return (y, h, c) if lstm_ else (y, h)
        geometry = (X.shape, W.shape, R.shape)
        layer = layers.get(geometry)
        if layer is None:
            layer = _native_spec(op, X.shape, W.shape, R.shape, *spec_args)
            if len(layers) < 64:
                layers[geometry] = layer
        init = [initial_h, c0] if lstm_ else [initial_h]
        out = _run_layer(layer, X, W, R, B, P, sequence_lens, init, layout)
        if plannable and sequence_lens is None and X.shape not in plans and len(plans) < 16:
            plans[X.shape] = _call_plan(layer, X, W, R, B, P)  # None: this shape always takes the checked path
        return out

    return rnn_layer


def _state_ok(v, shape: tuple) -> bool:
    return v is None or (type(v) is np.ndarray and v.dtype == _F32 and v.shape == shape and v.flags.c_contiguous)


def _call_plan(layer: _rnn_native.Layer, X, W, R, B, P) -> tuple | None:
    """After a float32 layer-0 call without sequence_lens ran the checked path: what a later call with
    the same X shape and the same read-only weights passes to ``rnn_layer`` as is (the weights' native
    form, the config arrays, the output shapes), so it only allocates the outputs (LSTM of hidden 16,
    batch 2, 6 steps: ~18 us of Python around a 26 us extension call). None when the weights may change
    in place (writeable) or the extension would not project the inputs itself."""
    ws = (W, R, B, P)
    if not all(v is None or (type(v) is np.ndarray and not v.flags.writeable) for v in ws):
        return None
    seq, batch, inp = X.shape
    nd, hidden = len(layer.directions), R.shape[-1]
    bias, p, rbh, rt, wt = _native_weights(layer.op, W, R, B, P, nd, hidden, layer.linear_before_reset)
    if seq * batch * inp * wt.shape[1] > _rnn_native.PROJECT_MACS:
        return None
    cfg, fcfg, nbytes = layer.config(seq, batch, hidden, inp, True)
    return (W, R, B, P, (cfg, fcfg, nbytes, wt, bias, rt, p, rbh), (nd, batch, hidden), (seq, nd, batch, hidden))


@functools.lru_cache(maxsize=256)
def _native_spec(op: str, x_shape, w_shape, r_shape, layout: int, direction: str, names, alphas, betas,
                 hidden_size, clip, input_forget: int, linear_before_reset: int) -> _rnn_native.Layer:
    """The settled layer of one geometry and attribute set, checked as _prepare checks them (errors are
    raised, not cached)."""
    if layout not in (0, 1):
        raise KernelError(f"{op}: layout must be 0 or 1, got {layout}")
    n_gates = _GATES[op]
    if len(x_shape) != 3 or len(w_shape) != 3 or len(r_shape) != 3:
        raise KernelError(f"{op}: X, W and R must be 3-D, got {list(x_shape)}, {list(w_shape)}, {list(r_shape)}")
    hidden = r_shape[-1]
    if hidden_size is not None and hidden_size != hidden:
        raise KernelError(f"{op}: hidden_size={hidden_size} but R has hidden size {hidden}")
    if w_shape[1] != n_gates * hidden or r_shape[1] != n_gates * hidden or w_shape[2] != x_shape[2]:
        raise KernelError(f"{op}: W {list(w_shape)} / R {list(r_shape)} do not match {n_gates} gates of hidden "
                          f"size {hidden} and input size {x_shape[2]}")
    directions = _directions(direction, op)
    acts = _activations(op, names, alphas, betas, _DEFAULT_ACTS[op], len(directions))
    return _rnn_native.Layer(op, directions, _codes(acts), clip, input_forget, linear_before_reset)


_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}


# **** shared driver ****


def _directions(direction: str, op: str) -> tuple[bool, ...]:
    try:
        return {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[direction]
    except KeyError:
        raise KernelError(f"{op}: unknown direction {direction!r}") from None


def _lengths(seq_lens, seq: int, batch: int, op: str) -> np.ndarray | None:
    """Per-entry lengths, or None when every entry spans the whole sequence (the unmasked fast path)."""
    if seq_lens is None:
        return None
    lens = np.asarray(seq_lens).astype(np.int64).reshape(-1)
    if lens.shape != (batch,) or (lens < 0).any() or (lens > seq).any():
        raise KernelError(f"{op}: sequence_lens {lens.tolist()} must be {batch} values in [0, {seq}]")
    return None if (lens == seq).all() else lens


def _reverse_index(lens: np.ndarray | None, seq: int, batch: int):
    """Time index per (step, entry) of a reverse pass: entry b's step t reads position lens[b]-1-t."""
    if lens is None:
        return None
    t = np.arange(seq)[:, None]
    pos = lens[None, :] - 1 - t
    return np.where(pos >= 0, pos, t)  # steps past the entry's length read anything: they are masked


def _prepare(op: str, X, W, R, B, initial, layout: int, n_gates: int, hidden_size: int | None):
    if layout not in (0, 1):
        raise KernelError(f"{op}: layout must be 0 or 1, got {layout}")
    x = X.transpose(1, 0, 2) if layout else X
    if x.ndim != 3 or W.ndim != 3 or R.ndim != 3:
        raise KernelError(f"{op}: X, W and R must be 3-D, got {list(X.shape)}, {list(W.shape)}, {list(R.shape)}")
    hidden = R.shape[-1]
    if hidden_size is not None and hidden_size != hidden:
        raise KernelError(f"{op}: hidden_size={hidden_size} but R has hidden size {hidden}")
    if W.shape[1] != n_gates * hidden or R.shape[1] != n_gates * hidden or W.shape[2] != x.shape[2]:
        raise KernelError(f"{op}: W {list(W.shape)} / R {list(R.shape)} do not match {n_gates} gates of hidden "
                          f"size {hidden} and input size {x.shape[2]}")
    wd = X.dtype if X.dtype == _F32 else sp.work_dtype(X.dtype)  # dtype.name (in work_dtype) is slow
    init = [None if v is None else (v.transpose(1, 0, 2) if layout else v).astype(wd, copy=False) for v in initial]
    return x.astype(wd, copy=False), W.astype(wd, copy=False), R.astype(wd, copy=False), (
        None if B is None else B.astype(wd, copy=False)), init, hidden, wd


def _finish(ys: list, hs: list, cs: list | None, layout: int, dtype) -> tuple:
    y = np.stack(ys, axis=1)  # [seq, dirs, batch, hidden]
    return _outputs([y, np.stack(hs)] + ([np.stack(cs)] if cs is not None else []), layout, dtype)


def _outputs(out: list, layout: int, dtype) -> tuple:
    """Y [seq, dirs, batch, hidden] and states [dirs, batch, hidden] in the op's layout and dtype."""
    if layout:
        out = [out[0].transpose(2, 0, 1, 3)] + [v.transpose(1, 0, 2) for v in out[1:]]
    return tuple(np.ascontiguousarray(v, dtype=dtype) for v in out)


def _projection(x, w, b_in, rev_idx, reverse: bool) -> np.ndarray:
    """x @ W^T + bias for every step at once, in processing order (reversed per entry when reverse)."""
    seq, batch, _ = x.shape
    if reverse:
        x = x[::-1] if rev_idx is None else x[rev_idx, np.arange(batch)[None, :]]
    xw = np.matmul(x.reshape(seq * batch, -1), w.T).reshape(seq, batch, -1)
    if b_in is not None:
        xw += b_in
    return xw


def _unreverse(y: np.ndarray, rev_idx, reverse: bool) -> np.ndarray:
    if not reverse:
        return y
    if rev_idx is None:
        return y[::-1]
    out = np.empty_like(y)
    out[rev_idx, np.arange(y.shape[1])[None, :]] = y
    return out


def _stack(ctxs: list) -> tuple:
    """Per-direction contexts (xw [seq, batch, GH], rt [H, GH], extra vectors [H] or None) stacked so
    one step computes every direction: xw [seq, dirs, batch, GH], rt [dirs, H, GH], vectors [dirs, 1, H]."""
    xw = np.stack([c[0] for c in ctxs], axis=1)
    rt = np.stack([c[1] for c in ctxs])
    extras = tuple(None if c0 is None else np.stack([c[2][k] for c in ctxs])[:, None, :]
                   for k, c0 in enumerate(ctxs[0][2]))
    return xw, rt, extras


def _run(op: str, step, x, lens, directions, n_state: int, init, hidden, wd, make_dir,
         acts: list) -> tuple[list, list]:
    """Drive ``step`` over every direction; returns per-direction Y, final states.

    Directions with the same activations run in one loop (every per-step op batched over them: half
    the Python overhead per step for a bidirectional layer).
    """
    seq, batch, _ = x.shape
    rev_idx = _reverse_index(lens, seq, batch) if any(directions) else None
    mask = None if lens is None else (np.arange(seq)[:, None] < lens[None, :])[..., None]  # [seq, batch, 1]
    nd = len(directions)
    groups = [list(range(nd))] if all(a == acts[0] for a in acts) else [[d] for d in range(nd)]
    ys, finals = [None] * nd, [[None] * nd for _ in range(n_state)]
    for dirs in groups:
        ctx = _stack([make_dir(d, directions[d], rev_idx) for d in dirs])
        state = [np.zeros((len(dirs), batch, hidden), wd) if v is None else np.array(v[dirs], dtype=wd)
                 for v in init]
        y = np.zeros((seq, len(dirs), batch, hidden), wd)
        fns = acts[dirs[0]]
        for t in range(seq):
            new = step(ctx, fns, t, state)
            if mask is not None:
                m = mask[t]
                new = [np.where(m, n, s) for n, s in zip(new, state)]
                np.multiply(new[0], m, out=y[t])
            else:
                y[t] = new[0]
            state = new
        if lens is not None and not lens.all():
            state = [v * (lens > 0)[:, None] for v in state]  # onnxruntime: empty entries end in zeros
        for j, d in enumerate(dirs):
            ys[d] = _unreverse(y[:, j], rev_idx, directions[d])
            for k in range(n_state):
                finals[k][d] = state[k][j]
    return ys, finals


def _clip(g, clip):
    if clip is not None:
        np.clip(g, -clip, clip, out=g)
    return g


def _bias(B, d: int, n: int, hidden: int):
    """(input bias + recurrent bias) of direction d, and the recurrent bias alone."""
    if B is None:
        return None, None
    if B.shape[-1] != 2 * n * hidden:
        raise KernelError(f"B of shape {list(B.shape)} must have {2 * n * hidden} values per direction")
    return B[d, :n * hidden] + B[d, n * hidden:], B[d, n * hidden:]


# **** LSTM ****


@kernel("LSTM", since=1)
def lstm(
    X: np.ndarray, W: np.ndarray, R: np.ndarray, B: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None, initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None, P: np.ndarray | None = None, *,
    activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
    activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
    hidden_size: int | None = None, input_forget: int = 0, layout: int = 0, output_sequence: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if _rnn_native.usable(X.dtype if X.dtype == _F32 else sp.work_dtype(X.dtype)):
        return _native_layer("LSTM", X, W, R, B, P, sequence_lens, [initial_h, initial_c], layout=layout,
                             direction=direction, activations=activations, activation_alpha=activation_alpha,
                             activation_beta=activation_beta, clip=clip, hidden_size=hidden_size,
                             input_forget=input_forget)
    directions = _directions(direction, "LSTM")
    x, w, r, b, init, hidden, wd = _prepare("LSTM", X, W, R, B, [initial_h, initial_c], layout, 4, hidden_size)
    acts = _activations("LSTM", activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh", "Tanh"),
                        len(directions))
    lens = _lengths(sequence_lens, x.shape[0], x.shape[1], "LSTM")
    p = None if P is None else P.astype(wd, copy=False).reshape(len(directions), 3, hidden)
    hs = hidden

    def make_dir(d, reverse, rev_idx):
        b_sum, _ = _bias(b, d, 4, hs)
        return (_projection(x, w[d], b_sum, rev_idx, reverse), np.ascontiguousarray(r[d].T),
                (None, None, None) if p is None else (p[d, 0], p[d, 1], p[d, 2]))

    def step(ctx, fns, t, state):
        xw, rt, (pi, po, pf) = ctx
        (fa, fa_a, fa_b), (ga, ga_a, ga_b), (ha, ha_a, ha_b) = fns
        h, c = state
        g = np.matmul(h, rt)
        g += xw[t]
        if pi is None:
            _clip(g, clip)
            s = fa(g[..., :3 * hs], fa_a, fa_b)
            i, o, f = s[..., :hs], s[..., hs:2 * hs], s[..., 2 * hs:]
        else:  # peepholes join before the clip; the output gate's needs the new cell state
            g[..., :hs] += pi * c
            g[..., 2 * hs:3 * hs] += pf * c
            i = fa(_clip(g[..., :hs], clip), fa_a, fa_b)
            f = fa(_clip(g[..., 2 * hs:3 * hs], clip), fa_a, fa_b)
            _clip(g[..., 3 * hs:], clip)
            o = g[..., hs:2 * hs]
        if input_forget:
            f = 1 - i
        cc = ga(g[..., 3 * hs:], ga_a, ga_b)
        c_new = f * c
        cc *= i
        c_new += cc
        if pi is not None:
            o = fa(_clip(o + po * c_new, clip), fa_a, fa_b)
        h_new = ha(c_new.copy(), ha_a, ha_b)
        h_new *= o
        return [h_new, c_new]

    ys, (h_fin, c_fin) = _run("LSTM", step, x, lens, directions, 2, init, hidden, wd, make_dir, acts)
    return _finish(ys, h_fin, c_fin, layout, X.dtype)


# **** GRU ****


def _gru_bias(b, d: int, hs: int, linear_before_reset: int):
    """The bias folded into the projection, and Rbh (which linear_before_reset keeps inside the reset product)."""
    b_sum, rb = _bias(b, d, 3, hs)
    if b_sum is None:
        return None, None
    if linear_before_reset:
        b_sum = b_sum.copy()
        b_sum[2 * hs:] -= rb[2 * hs:]
    return b_sum, rb[2 * hs:]


@kernel("GRU", since=1)
def gru(
    X: np.ndarray, W: np.ndarray, R: np.ndarray, B: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None, initial_h: np.ndarray | None = None, *,
    activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
    activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
    hidden_size: int | None = None, layout: int = 0, linear_before_reset: int = 0, output_sequence: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    if _rnn_native.usable(X.dtype if X.dtype == _F32 else sp.work_dtype(X.dtype)):
        return _native_layer("GRU", X, W, R, B, None, sequence_lens, [initial_h], layout=layout, direction=direction,
                             activations=activations, activation_alpha=activation_alpha,
                             activation_beta=activation_beta, clip=clip, hidden_size=hidden_size,
                             linear_before_reset=linear_before_reset)
    directions = _directions(direction, "GRU")
    x, w, r, b, init, hidden, wd = _prepare("GRU", X, W, R, B, [initial_h], layout, 3, hidden_size)
    acts = _activations("GRU", activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh"), len(directions))
    lens = _lengths(sequence_lens, x.shape[0], x.shape[1], "GRU")
    hs = hidden

    def make_dir(d, reverse, rev_idx):
        b_sum, rbh = _gru_bias(b, d, hs, linear_before_reset)
        rt = np.ascontiguousarray(r[d].T)
        return _projection(x, w[d], b_sum, rev_idx, reverse), rt, (rbh,)

    def step(ctx, fns, t, state):
        xw, rt, (rbh,) = ctx
        (fa, fa_a, fa_b), (ga, ga_a, ga_b) = fns
        (h,) = state
        xt = xw[t]
        if linear_before_reset:
            hr = np.matmul(h, rt)
            zr = hr[..., :2 * hs]
            zr += xt[..., :2 * hs]
            zr = fa(_clip(zr, clip), fa_a, fa_b)
            hh = hr[..., 2 * hs:]
            if rbh is not None:
                hh += rbh
            hh *= zr[..., hs:]
            hh += xt[..., 2 * hs:]
        else:
            zr = np.matmul(h, rt[..., :2 * hs])
            zr += xt[..., :2 * hs]
            zr = fa(_clip(zr, clip), fa_a, fa_b)
            hh = np.matmul(zr[..., hs:] * h, rt[..., 2 * hs:])
            hh += xt[..., 2 * hs:]
        hh = ga(_clip(hh, clip), ga_a, ga_b)
        z = zr[..., :hs]
        # (1 - z) * hh + z * h  ==  hh + z * (h - hh)
        h_new = h - hh
        h_new *= z
        h_new += hh
        return [h_new]

    ys, (h_fin,) = _run("GRU", step, x, lens, directions, 1, init, hidden, wd, make_dir, acts)
    return _finish(ys, h_fin, None, layout, X.dtype)


# **** RNN ****


@kernel("RNN", since=1)
def rnn(
    X: np.ndarray, W: np.ndarray, R: np.ndarray, B: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None, initial_h: np.ndarray | None = None, *,
    activation_alpha: list[float] | None = None, activation_beta: list[float] | None = None,
    activations: list[str] | None = None, clip: float | None = None, direction: str = "forward",
    hidden_size: int | None = None, layout: int = 0, output_sequence: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    if _rnn_native.usable(X.dtype if X.dtype == _F32 else sp.work_dtype(X.dtype)):
        return _native_layer("RNN", X, W, R, B, None, sequence_lens, [initial_h], layout=layout, direction=direction,
                             activations=activations, activation_alpha=activation_alpha,
                             activation_beta=activation_beta, clip=clip, hidden_size=hidden_size)
    directions = _directions(direction, "RNN")
    x, w, r, b, init, hidden, wd = _prepare("RNN", X, W, R, B, [initial_h], layout, 1, hidden_size)
    acts = _activations("RNN", activations, activation_alpha, activation_beta, ("Tanh",), len(directions))
    lens = _lengths(sequence_lens, x.shape[0], x.shape[1], "RNN")

    def make_dir(d, reverse, rev_idx):
        b_sum, _ = _bias(b, d, 1, hidden)
        return _projection(x, w[d], b_sum, rev_idx, reverse), np.ascontiguousarray(r[d].T), ()

    def step(ctx, fns, t, state):
        xw, rt, _ = ctx
        ((fa, fa_a, fa_b),) = fns
        g = np.matmul(state[0], rt)
        g += xw[t]
        return [fa(_clip(g, clip), fa_a, fa_b)]

    ys, (h_fin,) = _run("RNN", step, x, lens, directions, 1, init, hidden, wd, make_dir, acts)
    return _finish(ys, h_fin, None, layout, X.dtype)


@specializes(lstm)
def _lstm_bound(consts: dict, n_inputs: int, **attrs):
    return _specialized("LSTM", lstm, attrs)


@specializes(gru)
def _gru_bound(consts: dict, n_inputs: int, **attrs):
    return _specialized("GRU", gru, attrs)


@specializes(rnn)
def _rnn_bound(consts: dict, n_inputs: int, **attrs):
    return _specialized("RNN", rnn, attrs)
