"""Activations, Softmax/LogSoftmax, Clip, Erf/Gelu and Identity.

Each kernel allocates one output buffer and works in place on it. Half-precision inputs of
activations are computed in float32 and cast back (one rounding; float16 ``exp`` overflows at 11).
numpy has no ``erf``; :func:`_erf_inplace` is a float32 rational approximation (max error 7 ulp, computed in
float32) and float64 inputs use ``math.erf`` exactly.

float32 Erf and last-axis Softmax take one native call (``_native/encoder_act.c``) when the extension is
built: on a BERT layer's small tensors the dozen numpy passes cost 10-20x the arithmetic. The native Erf
is the same approximation in the same float32 operations (the same bits); the native Softmax differs
from the numpy code by the rounding of its sum's order and of ``expf``.
"""

from __future__ import annotations

import math

import numpy as np

from onnx_prepared.kernels import native
from onnx_prepared.kernels.registry import kernel, specializes

_HALF = frozenset({"float16", "bfloat16"})

#: ONNX's default Clip-6 bounds (float32 lowest/max): treated as "no bound".
_FLT_MAX = float(np.finfo(np.float32).max)


def _work(x: np.ndarray) -> np.ndarray:
    """A fresh float buffer holding ``x`` (float32 for half types) that a kernel may overwrite."""
    if x.dtype.itemsize == 2 and x.dtype.name in _HALF:  # dtype.name costs ~1.5 us: sized first
        return x.astype(np.float32)
    return np.array(x, copy=True)


def _back(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return y if y.dtype == dtype else y.astype(dtype)


# **** simple activations ****


@kernel("Relu", since=6)
def relu(x: np.ndarray) -> tuple[np.ndarray]:
    """``maximum(x, 0)``; float32 in one native pass (act.c: numpy's bits, NaN kept, -0.0 to +0.0; numpy's
    float32 maximum against a scalar ran at ~2.7 floats/ns here, ResNet-18's [2, 64, 16, 16] 12 us)."""
    ext = native._ext
    if ext is not None and x.dtype == np.float32 and x.flags.c_contiguous:
        y = np.empty_like(x)
        ext.relu(x, y)
        return (y,)
    return (np.asarray(np.maximum(x, 0)),)


@kernel("LeakyRelu", since=6)
def leaky_relu(x: np.ndarray, *, alpha: float = 0.01) -> tuple[np.ndarray]:
    y = _work(x)
    with np.errstate(invalid="ignore"):  # 0 * -inf is NaN, quietly (as onnxruntime)
        np.multiply(y, alpha, out=y, where=y < 0)
    return (_back(y, x.dtype),)


@specializes(leaky_relu)
def _leaky_relu_bound(consts: dict, n_inputs: int, *, alpha: float = 0.01):
    """With a slope in (0, 1], ``max(x, alpha * x)`` is the same value as ``x < 0 ? alpha * x : x`` (NaN,
    infinities and -0.0 included; a zero slope would make ``0 * inf`` NaN) in two ufunc calls instead of
    a copy, a comparison and a masked multiply (10.7 -> 3.0 us on [1, 16, 4, 4])."""
    if not 0.0 < alpha <= 1.0:
        return None
    slopes = {np.dtype(np.float32): np.float32(alpha), np.dtype(np.float64): np.float64(alpha)}

    def leaky_relu_unit_slope(x: np.ndarray) -> tuple[np.ndarray]:
        a = slopes.get(x.dtype)
        if a is None:
            return leaky_relu(x, alpha=alpha)
        y = np.multiply(x, a)
        np.maximum(y, x, out=y)
        return (y,)

    return leaky_relu_unit_slope


@kernel("Elu", since=6)
def elu(x: np.ndarray, *, alpha: float = 1.0) -> tuple[np.ndarray]:
    y = _work(x)
    neg = y < 0
    with np.errstate(over="ignore"):
        np.expm1(y, out=y, where=neg)
    np.multiply(y, alpha, out=y, where=neg)
    return (_back(y, x.dtype),)


@kernel("HardSigmoid", since=6)
def hard_sigmoid(x: np.ndarray, *, alpha: float = 0.2, beta: float = 0.5) -> tuple[np.ndarray]:
    y = _work(x)
    y *= alpha
    y += beta
    np.clip(y, 0, 1, out=y)
    return (_back(y, x.dtype),)


@kernel("Sigmoid", since=6)
def sigmoid(x: np.ndarray) -> tuple[np.ndarray]:
    """float32 goes native (kernels/_native/act.c: onnxruntime's MLAS logistic, bit for bit at the
    dispatch level MLAS picks here); other dtypes ``1 / (1 + exp(-x))`` (exp overflow gives 0 correctly,
    so only the warning is silenced)."""
    if x.dtype == np.float32:
        from onnx_prepared.kernels import native

        y = native.sigmoid_f32(x)
        if y is not None:
            return (y,)
    y = _work(x)
    np.negative(y, out=y)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += 1
    np.reciprocal(y, out=y)
    return (_back(y, x.dtype),)


@kernel("PRelu", since=7)
def prelu(x: np.ndarray, slope: np.ndarray) -> tuple[np.ndarray]:
    """``slope`` broadcasts unidirectionally to ``x`` (e.g. (C, 1, 1) against NCHW)."""
    y = np.asarray(np.multiply(x, slope))
    np.copyto(y, x, where=x >= 0)
    return (y,)


@kernel("Softplus", since=1)
def softplus(x: np.ndarray) -> tuple[np.ndarray]:
    """``log(1 + exp(x))`` without overflow."""
    y = _work(x)
    np.logaddexp(0, y, out=y)
    return (_back(y, x.dtype),)


@kernel("Softsign", since=1)
def softsign(x: np.ndarray) -> tuple[np.ndarray]:
    y = _work(x)
    d = np.abs(y)
    d += 1
    y /= d
    return (_back(y, x.dtype),)


@kernel("Selu", since=6)
def selu(x: np.ndarray, *, alpha: float = 1.67326319217681884765625,
         gamma: float = 1.05070102214813232421875) -> tuple[np.ndarray]:
    y = _work(x)
    neg = y <= 0
    np.expm1(y, out=y, where=neg)
    np.multiply(y, alpha, out=y, where=neg)
    y *= gamma
    return (_back(y, x.dtype),)


@kernel("ThresholdedRelu", since=10)
def thresholded_relu(x: np.ndarray, *, alpha: float = 1.0) -> tuple[np.ndarray]:
    y = np.array(x, copy=True)
    y[~(x > alpha)] = 0
    return (y,)


@kernel("HardSwish", since=14)
def hard_swish(x: np.ndarray) -> tuple[np.ndarray]:
    """``x * max(0, min(1, x / 6 + 1 / 2))``; float32 in one native pass (act.c: the same roundings, so the
    same bits as the numpy ufuncs below, without their four calls' fixed cost)."""
    ext = native._ext
    if ext is not None and x.dtype == np.float32 and x.flags.c_contiguous:
        y = np.empty_like(x)
        ext.hardswish(x, y)
        return (y,)
    w = _work(x)
    t = np.multiply(w, 1.0 / 6.0, out=np.empty_like(w))  # (w * c of a 0-d array is a scalar: no out= below)
    t += 0.5
    np.clip(t, 0, 1, out=t)
    t *= w
    return (_back(t, x.dtype),)


@kernel("Tanh", since=6)
def tanh(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.tanh(x)),)


@kernel("Identity", since=1)
def identity(x):
    """Tensors, sequences and optionals pass through unchanged (kernels never mutate inputs)."""
    return (x,)


# **** Clip ****


@kernel("Clip", since=6)
def clip_6(x: np.ndarray, *, min: float = -_FLT_MAX, max: float = _FLT_MAX) -> tuple[np.ndarray]:
    """Bounds as attributes (opset 6-10)."""
    y = x
    if min > -_FLT_MAX:
        y = np.asarray(np.maximum(y, np.asarray(min, dtype=x.dtype)))
    if max < _FLT_MAX:
        y = np.minimum(y, np.asarray(max, dtype=x.dtype), out=None if y is x else y)
    return (np.asarray(y),)


@kernel("Clip", since=11)
def clip_11(x: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> tuple[np.ndarray]:
    """Bounds as optional 0-d inputs; when ``min > max`` every value becomes ``max``."""
    y = x
    if lo is not None:
        y = np.asarray(np.maximum(y, lo))
    if hi is not None:
        y = np.minimum(y, hi, out=None if y is x else y)
    return (np.asarray(y),)


# **** Softmax family ****


#: elements up to which the native Softmax is faster: beyond, numpy's SIMD exp wins over scalar expf
_NATIVE_SOFTMAX_MAX = 1 << 13


def _softmax(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    # NOTE: computed in the input dtype even for float16/bfloat16 (max-subtracted exp cannot
    # overflow): the backend tests' expected values (test_attention_*_bf16_expanded) carry
    # half-precision rounding at every step, and a float32 computation misses them by > rtol.
    if x.size == 0:
        return np.empty_like(x)
    ext = native._ext
    if (ext is not None and not log and x.dtype == np.float32 and x.ndim and (axis == -1 or axis == x.ndim - 1)
            and x.size <= _NATIVE_SOFTMAX_MAX):
        xc = np.ascontiguousarray(x)
        y = np.empty(x.shape, np.float32)
        ext.softmax_f32(xc, y, x.size // x.shape[-1], x.shape[-1])
        return y
    y = np.array(x, copy=True)
    y -= np.max(y, axis=axis, keepdims=True)
    if log:
        e = np.exp(y)
        y -= np.log(np.sum(e, axis=axis, keepdims=True))
    else:
        np.exp(y, out=y)
        y /= np.sum(y, axis=axis, keepdims=True)
    return y


def _coerced(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Opset 1-12 semantics: flatten to 2-D at ``axis`` and normalize each row."""
    axis = axis + x.ndim if axis < 0 else axis
    rows = math.prod(x.shape[:axis])
    y = _softmax(x.reshape(rows, math.prod(x.shape[axis:])), 1, log)
    return y.reshape(x.shape)


@kernel("Softmax", since=1)
def softmax_1(x: np.ndarray, *, axis: int = 1) -> tuple[np.ndarray]:
    return (_coerced(x, axis, False),)


@kernel("Softmax", since=13)
def softmax_13(x: np.ndarray, *, axis: int = -1) -> tuple[np.ndarray]:
    return (_softmax(x, axis, False),)


@kernel("LogSoftmax", since=1)
def log_softmax_1(x: np.ndarray, *, axis: int = 1) -> tuple[np.ndarray]:
    return (_coerced(x, axis, True),)


@kernel("LogSoftmax", since=13)
def log_softmax_13(x: np.ndarray, *, axis: int = -1) -> tuple[np.ndarray]:
    return (_softmax(x, axis, True),)


# **** Erf and Gelu ****

# Rational approximation of erf on [-4, 4] (erf(±4) rounds to ±1 in float32), as in Eigen's
# generic_fast_erf_float: erf(x) ~= x * P(x^2) / Q(x^2).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)
_math_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_inplace(y: np.ndarray) -> np.ndarray:
    """erf of a float32 (or float64, exact) work buffer, written into the buffer."""
    if y.dtype == np.float64:
        y[...] = _math_erf(y)
        return y
    np.clip(y, -4.0, 4.0, out=y)
    x2 = np.square(y)
    p = np.full_like(y, _ERF_P[0])
    for c in _ERF_P[1:]:
        p *= x2
        p += y.dtype.type(c)
    q = np.full_like(y, _ERF_Q[0])
    for c in _ERF_Q[1:]:
        q *= x2
        q += y.dtype.type(c)
    y *= p
    y /= q
    return y


@kernel("Erf", since=9)
def erf(x: np.ndarray) -> tuple[np.ndarray]:
    if x.dtype.kind != "f":  # integer Erf (allowed by the schema): compute in float64, round back
        return (np.rint(_erf_inplace(x.astype(np.float64))).astype(x.dtype),)
    if x.dtype == np.float32 and native._ext is not None:
        y = np.empty(x.shape, np.float32)
        native._ext.erf_f32(np.ascontiguousarray(x), y, x.size)
        return (y,)
    return (_back(_erf_inplace(_work(x)), x.dtype),)


@kernel("Gelu", since=20)
def gelu(x: np.ndarray, *, approximate: str = "none") -> tuple[np.ndarray]:
    """``0.5 x (1 + erf(x / sqrt 2))``, or the tanh form when ``approximate="tanh"``."""
    w = _work(x)
    t = w.copy()
    if approximate == "tanh":
        t *= t
        t *= 0.044715
        t += 1
        t *= w
        t *= math.sqrt(2.0 / math.pi)
        np.tanh(t, out=t)
    else:
        t *= 1.0 / math.sqrt(2.0)
        _erf_inplace(t)
    t += 1
    t *= w
    t *= 0.5
    return (_back(t, x.dtype),)


@kernel("GeluErf", since=1, domain="onnx_prepared")
def gelu_erf(x: np.ndarray, *, d: float = 2 ** 0.5, a: float = 1.0, m: float = 0.5) -> tuple[np.ndarray]:
    """The exact GELU as exported, ``Mul(Mul(x, Add(Erf(Div(x, d)), a)), m)`` (resolve/fusions.py), in
    those float32 operations and that order: float32 in one native call (``gelu_erf_f32``), anything
    else the unfused kernels one after another; the same values either way."""
    if x.dtype == np.float32 and native._ext is not None:
        y = np.empty(x.shape, np.float32)
        native._ext.gelu_erf_f32(np.ascontiguousarray(x), y, x.size, d, a, m)
        return (y,)
    t = np.divide(x, np.asarray(d, x.dtype))
    (e,) = erf(t)
    e += np.asarray(a, x.dtype)
    e = np.multiply(x, e)
    e *= np.asarray(m, x.dtype)
    return (e,)


@kernel("ScaledMaskedSoftmax", since=1, domain="onnx_prepared")
def scaled_masked_softmax(x: np.ndarray, mask: np.ndarray, *, d: float = 1.0) -> tuple[np.ndarray]:
    """``Softmax(Add(Div(x, d), mask), axis=-1)``, an attention block's scores (resolve/fusions.py): the
    same Div, Add and Softmax kernels' operations, in one call."""
    t = np.asarray(np.divide(x, np.asarray(d, x.dtype)))
    try:  # the mask broadcast into the scores' shape, in place (np.broadcast_shapes alone costs ~5 us)
        np.add(t, mask, out=t)
    except ValueError:  # the sum is larger than the scores
        t = np.asarray(np.add(t, mask))
    return (_softmax(t, -1, False),)
