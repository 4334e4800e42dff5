"""Pad (opsets 2, 11, 18, 19): constant / reflect / edge / wrap; negative pads crop.

Opset 2 takes ``pads`` and ``value`` as attributes, opset 11 as inputs, opset 18 adds ``axes``, opset
19 the ``wrap`` mode. Constant padding writes the input into a filled array; the other modes use
``np.pad``. Pads known to be all zero at binding return the input itself.
"""

from __future__ import annotations

import numpy as np

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.registry import kernel, specializes

_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(x: np.ndarray, pads, mode: str, value, axes) -> np.ndarray:
    rank = x.ndim
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = list(range(rank)) if axes is None or np.size(axes) == 0 else [
        int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1)]
    if len(pads) != 2 * len(axes) or any(not 0 <= a < rank for a in axes):
        raise KernelError(f"Pad: pads {pads} must have 2 values per axis of {axes} (input rank {rank})")
    if mode not in _MODES:
        raise KernelError(f"Pad: unknown mode {mode!r}")
    begin, end = [0] * rank, [0] * rank
    for j, a in enumerate(axes):
        begin[a], end[a] = pads[j], pads[j + len(axes)]
    if any(b < 0 or e < 0 for b, e in zip(begin, end)):  # crop first
        x = x[tuple(slice(max(0, -b), x.shape[i] - max(0, -e)) for i, (b, e) in enumerate(zip(begin, end)))]
        begin, end = [max(0, b) for b in begin], [max(0, e) for e in end]
    if not any(begin) and not any(end):
        return x.copy()
    if mode == "constant":
        shape = tuple(n + b + e for n, b, e in zip(x.shape, begin, end))
        fill = 0 if value is None or np.size(value) == 0 else np.asarray(value).reshape(-1)[0]
        y = np.full(shape, fill, dtype=x.dtype)
        y[tuple(slice(b, b + n) for b, n in zip(begin, x.shape))] = x
        return y
    if x.size == 0:
        raise KernelError(f"Pad: mode {mode!r} cannot pad an empty input of shape {list(x.shape)}")
    if mode == "reflect" and any(max(b, e) >= n for b, e, n in zip(begin, end, x.shape) if b or e):
        raise KernelError(f"Pad: reflect pads {pads} must be smaller than the axis sizes {list(x.shape)}")
    return np.pad(x, list(zip(begin, end)), mode=_MODES[mode])


@kernel("Pad", since=2)
def pad_2(data: np.ndarray, *, mode: str = "constant", pads: list[int], value: float = 0.0) -> tuple[np.ndarray]:
    return (_pad(data, pads, mode, np.array(value, dtype=data.dtype), None),)


@kernel("Pad", since=11)
def pad_11(data: np.ndarray, pads: np.ndarray, constant_value: np.ndarray | None = None,
           axes: np.ndarray | None = None, *, mode: str = "constant") -> tuple[np.ndarray]:
    return (_pad(data, pads, mode, constant_value, axes),)



def _zero_pads(pads, generic):
    """The input itself when ``pads`` (known at binding) are all zero and fit its rank (else
    ``generic``, which reports the mismatch), or None for other pads."""
    if pads is None:
        return None
    if type(pads) is list:  # an attribute's ints (Pad-2): no array round trip (~7 us)
        if not pads or any(pads):
            return None
        twice_rank = len(pads)
    else:
        if np.size(pads) == 0 or np.any(np.asarray(pads)):
            return None
        twice_rank = int(np.size(pads))

    def unpadded(data: np.ndarray, *rest) -> tuple[np.ndarray]:
        return (data,) if 2 * data.ndim == twice_rank else generic(data, *rest)

    return unpadded


@specializes(pad_2)
def _pad_2_bound(consts: dict, n_inputs: int, *, mode: str = "constant", pads: list[int], value: float = 0.0):
    """All-zero pads (exporters write them, e.g. torch's AvgPool2d at opset 9): the input itself, no
    copy (kernels never mutate their inputs), instead of ~18 us of pads parsing and a copy per run."""
    if mode not in _MODES:
        return None
    return _zero_pads(pads, lambda data: pad_2(data, mode=mode, pads=pads, value=value))


@specializes(pad_11)
def _pad_11_bound(consts: dict, n_inputs: int, *, mode: str = "constant"):
    """Constant all-zero pads over every axis (no ``axes`` input): the input itself, as :func:`_pad_2_bound`."""
    if mode not in _MODES or 1 not in consts or (n_inputs > 3 and consts.get(3, 0) is not None):
        return None
    return _zero_pads(consts[1], lambda *args: pad_11(*args, mode=mode))
