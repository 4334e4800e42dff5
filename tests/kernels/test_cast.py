"""Cast and CastLike kernels against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.kernels.onnx_node_check import check, run_ours

FLOATS = np.array([0.0, -0.0, 0.5, -1.25, 3.75, 100.5, -300.0, 1e5, -1e5, 65504.0, 1e-3, 2.5, -2.5], np.float32)
SPECIAL = np.array([np.inf, -np.inf, np.nan], np.float32)

STANDARD = [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16, TensorProto.INT8,
            TensorProto.UINT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT32,
            TensorProto.BOOL]
FLOAT8 = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ]
SUB_BYTE = [TensorProto.INT4, TensorProto.UINT4]


def _name(t: int) -> str:
    return TensorProto.DataType.Name(t)


def _values_for(to: int) -> np.ndarray:
    """Values whose conversion is defined for ``to`` (no NaN/inf/out-of-range into integers)."""
    np_to = helper.tensor_dtype_to_np_dtype(to)
    if np.dtype(np_to).kind in "iu":
        return np.array([0, 1, 2, 7, 100, 3, 5], np.float32)
    return np.concatenate([FLOATS, SPECIAL])


@pytest.mark.parametrize("to", STANDARD, ids=_name)
@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
def test_cast_standard_types(src, to):
    with np.errstate(over="ignore"):  # 1e5 becomes inf in float16, on purpose
        x = _values_for(to).astype(src) if np.dtype(src).kind == "f" else np.array([0, 1, 2, 7, 100, 3], dtype=src)
    check("Cast", [x.reshape(-1, 1)], opset=13, to=to)


@pytest.mark.parametrize("to", FLOAT8, ids=_name)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [np.float32, np.float16])
def test_cast_float8_saturate(src, to, saturate):
    with np.errstate(over="ignore"):
        x = np.concatenate([FLOATS, SPECIAL, [448.0, 500.0, -1000.0, 57344.0, 60000.0]]).astype(src)
    (y,) = check("Cast", [x], opset=19, to=to, saturate=saturate)
    assert y.dtype == helper.tensor_dtype_to_np_dtype(to)


@pytest.mark.parametrize("frm", FLOAT8 + SUB_BYTE, ids=_name)
@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT8], ids=_name)
def test_cast_from_exotic(frm, to):
    np_frm = helper.tensor_dtype_to_np_dtype(frm)
    x = np.array([0, 1, 2, 3, 5, 6, 7], np.float32).astype(np_frm)
    check("Cast", [x], opset=21, to=to)


@pytest.mark.parametrize("to", SUB_BYTE, ids=_name)
def test_cast_to_int4(to):
    check("Cast", [np.array([0, 1, 5, 7, 2], np.float32)], opset=21, to=to)


def test_cast_float8e8m0_round_modes():
    x = np.array([1.0, 3.0, 0.75, 5.0, 1e10], np.float32)
    for mode in ("up", "down", "nearest"):
        check("Cast", [x], opset=24, to=TensorProto.FLOAT8E8M0, round_mode=mode)


def test_cast_same_type_is_not_copied():
    x = FLOATS.copy()
    (y,) = check("Cast", [x], opset=13, to=TensorProto.FLOAT)
    assert y is x


def test_cast_strings():
    (y,) = run_ours("Cast", [np.array([1.5, -2.0], np.float32)], opset=13, to=TensorProto.STRING)
    assert y.dtype == object and y.tolist() == ["1.5", "-2.0"]
    strings = np.array(["1.5", "-2", "inf", "NaN", "-INF"], dtype=object)
    (y,) = check("Cast", [strings], opset=13, to=TensorProto.FLOAT)
    assert y.dtype == np.float32
    (y,) = run_ours("Cast", [strings], opset=13, to=TensorProto.STRING)
    assert y is strings


def test_cast_scalar_and_empty():
    (y,) = check("Cast", [np.array(2.5, np.float32)], opset=13, to=TensorProto.INT64)
    assert y.shape == ()
    for to in (TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.BFLOAT16):
        (y,) = check("Cast", [np.array(2.5, np.float32)], opset=24, to=to)
        assert y.shape == ()
    # onnx.reference's float8e8m0 conversion fails on 0-d inputs; ours converts flat.
    (y,) = run_ours("Cast", [np.array(3.0, np.float32)], opset=24, to=TensorProto.FLOAT8E8M0)
    assert y.shape == () and float(y) == 4.0  # round_mode "up"
    check("Cast", [np.zeros((0, 3), np.float32)], opset=13, to=TensorProto.FLOAT16)


def test_cast_opset6_and_9():
    check("Cast", [FLOATS], opset=6, to=TensorProto.DOUBLE)
    check("Cast", [FLOATS], opset=9, to=TensorProto.FLOAT16)


@pytest.mark.parametrize("like", [np.float16, np.int32, np.float64, np.bool_])
def test_cast_like(like):
    x = np.array([0.0, 1.5, 3.0, -2.0], np.float32) if like != np.int32 else np.array([0, 1, 3, 2], np.float32)
    (y,) = check("CastLike", [x, np.zeros((1,), like)], opset=15)
    assert y.dtype == like


def test_cast_like_float8_saturate():
    x = np.array([1.0, 1000.0, -1000.0, np.inf], np.float32)
    like = np.zeros(1, helper.tensor_dtype_to_np_dtype(TensorProto.FLOAT8E4M3FN))
    check("CastLike", [x, like], opset=19, saturate=1)
    check("CastLike", [x, like], opset=19, saturate=0)
