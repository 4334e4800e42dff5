"""The prepacked static-quantization kernels (kernels/qlinear_packed.py, ``_native/qlinear.c``) against
onnxruntime, integer outputs bit for bit, at every dispatch level and without the extension.

The quantization parameters and weights are initializers, as ``quantize_static`` writes them, so the
prepack rules bind the nodes (asserted). Signed weights stay within [-63, 63] (``reduce_range``): on CPUs
without VNNI onnxruntime's u8 x s8 GEMM saturates int16 pairs past that (tests/helpers/ort_int8.py).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.kernels import native

MS = "com.microsoft"
LEVELS = [*native.supported_levels(), "numpy"]


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _ints(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


def _model(op, inputs, consts, out_elem, domain="", **attrs):
    """One node; ``inputs`` (name -> array) are graph inputs, ``consts`` (name -> array or None for an
    omitted optional input) initializers, in the node's input order."""
    order = list(inputs) + list(consts)
    node = helper.make_node(op, [n if (n in inputs or consts.get(n) is not None) else "" for n in order], ["y"],
                            domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", out_elem, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items() if v is not None])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def _ours(model: bytes, feeds: dict, level: str) -> np.ndarray:
    import onnx_prepared

    sess = onnx_prepared.InferenceSession(model)
    names = [k.name for k in sess._rt.resolved.kernels]
    assert all(n.startswith("prepacked:q") for n in names), names
    if level == "numpy":
        saved, native._ext = native._ext, None
        try:
            return sess.run(None, feeds)[0]
        finally:
            native._ext = saved
    with native.forced_level(level):
        return sess.run(None, feeds)[0]


def _check(model: bytes, feeds: dict, level: str) -> None:
    import onnxruntime as ort

    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = _ours(model, feeds, level)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, (ours.dtype, ours.shape, ref.dtype, ref.shape)
    np.testing.assert_array_equal(ours, ref)


CONVS = [  # (x shape, w shape, attrs)
    ((1, 3, 10, 11), (8, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 16, 9, 9), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 8, 12, 12), (20, 8, 3, 3), dict(dilations=[2, 2], pads=[2, 1, 0, 2])),
    ((1, 8, 7, 7), (12, 4, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    ((1, 6, 5, 5), (6, 1, 3, 3), dict(group=6, auto_pad="SAME_UPPER")),
    ((1, 32, 1, 1), (8, 32, 1, 1), {}),
    ((2, 7, 6, 5), (5, 7, 1, 1), dict(strides=[2, 1])),
    ((1, 5, 17), (9, 5, 3), dict(pads=[1, 2])),
    ((1, 4, 40, 37), (8, 4, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),  # stride-2 rows of 19: two gathers
    ((1, 16, 20, 20), (20, 16, 3, 3), dict(pads=[1, 1, 1, 1])),  # no column matrix, on the pool, 20 rows
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("types", [(np.uint8, np.int8, np.uint8), (np.uint8, np.uint8, np.uint8),
                                   (np.int8, np.int8, np.int8)], ids=lambda t: "-".join(np.dtype(x).name for x in t))
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_qlinear_conv_matches_onnxruntime(level, types, case):
    xt, wt, yt = types
    xshape, wshape, attrs = CONVS[case]
    rng = _rng("conv", case, xt, wt)
    m = wshape[0]
    per_channel = case % 2 == 1
    w = _ints(rng, wt, wshape, -63 if wt == np.int8 else 0, 63 if wt == np.int8 else 200)
    consts = {
        "x_scale": np.float32(0.02), "x_zero_point": _ints(rng, xt, ()),
        "w": w,
        "w_scale": rng.uniform(0.002, 0.01, m if per_channel else ()).astype(np.float32),
        "w_zero_point": np.full(m if per_channel else (), 0 if wt == np.int8 else 100, wt),
        "y_scale": np.float32(0.7), "y_zero_point": _ints(rng, yt, ()),
        "B": rng.integers(-3000, 3000, m).astype(np.int32) if case != 2 else None,
    }
    x = _ints(rng, xt, xshape)
    _check(_model("QLinearConv", {"x": x}, consts, helper.np_dtype_to_tensor_dtype(np.dtype(yt)), **attrs),
           {"x": x}, level)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("quantized_out", [False, True])
@pytest.mark.parametrize(("m", "trans_b", "per_column"), [(1, 1, False), (5, 0, True), (3, 1, True)])
def test_qgemm_matches_onnxruntime(level, quantized_out, m, trans_b, per_column):
    rng = _rng("qgemm", m, trans_b, per_column, quantized_out)
    k, n = 33, 10
    b = _ints(rng, np.int8, (n, k) if trans_b else (k, n), -63, 63)
    consts = {
        "a_scale": np.float32(0.05), "a_zero_point": np.uint8(7), "b": b,
        "b_scale": rng.uniform(0.01, 0.02, n if per_column else ()).astype(np.float32),
        "b_zero_point": np.zeros(n if per_column else (), np.int8),
        "c": rng.integers(-500, 500, n).astype(np.int32),
        "y_scale": np.float32(0.3) if quantized_out else None,
        "y_zero_point": np.uint8(128) if quantized_out else None,
    }
    a = _ints(rng, np.uint8, (m, k))
    out = TensorProto.UINT8 if quantized_out else TensorProto.FLOAT
    _check(_model("QGemm", {"a": a}, consts, out, MS, transB=trans_b, alpha=0.75), {"a": a}, level)


BINARY = [((1, 32, 12, 12), (1, 32, 12, 12)), ((1, 32, 12, 12), (1, 32, 1, 1)), ((1, 32, 1, 1), (1, 32, 12, 12)),
          ((2, 3, 5), (1,)), ((37,), (37,)), ((2, 3, 4), (3, 1))]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shapes", BINARY, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_binary_ops_match_onnxruntime(level, op, shapes, dtype):
    rng = _rng(op, shapes, dtype)
    a, b = _ints(rng, dtype, shapes[0]), _ints(rng, dtype, shapes[1])
    consts = {"a_scale": np.float32(0.031), "a_zero_point": _ints(rng, dtype, ()),
              "b_scale": np.float32(0.017), "b_zero_point": _ints(rng, dtype, ()),
              "c_scale": np.float32(0.045 if op == "QLinearAdd" else 0.2), "c_zero_point": _ints(rng, dtype, ())}
    _check(_binary_model(op, a, b, consts), {"a": a, "b": b}, level)


def _binary_model(op, a, b, consts):
    inputs = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "c_scale", "c_zero_point"]
    node = helper.make_node(op, inputs, ["y"], domain=MS)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in (("a", a), ("b", b))],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(a.dtype), None)],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape", [(1, 32, 12, 12), (2, 5, 3, 7, 2), (3, 4, 9)])
def test_global_average_pool_matches_onnxruntime(level, dtype, shape):
    rng = _rng("gap", dtype, shape)
    x = _ints(rng, dtype, shape)
    consts = {"x_scale": np.float32(0.05), "x_zero_point": _ints(rng, dtype, ()), "y_scale": np.float32(0.021),
              "y_zero_point": _ints(rng, dtype, ())}
    _check(_model("QLinearGlobalAveragePool", {"x": x}, consts, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), MS),
           {"x": x}, level)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("n", [1, 7, 300])
def test_quantize_and_dequantize_match_onnxruntime(level, dtype, n):
    rng = _rng("qdq", dtype, n)
    x = (rng.standard_normal((1, n)) * 4).astype(np.float32)
    x.reshape(-1)[: min(n, 4)] = [0.05, -0.15, 1e9, -1e9][: min(n, 4)]  # ties of x / 0.1 and saturation
    zp = _ints(rng, dtype, ())
    _check(_model("QuantizeLinear", {"x": x}, {"s": np.float32(0.1), "z": zp},
                  helper.np_dtype_to_tensor_dtype(np.dtype(dtype))), {"x": x}, level)
    q = _ints(rng, dtype, (2, n))
    _check(_model("DequantizeLinear", {"x": q}, {"s": np.float32(0.037), "z": zp}, TensorProto.FLOAT), {"x": q}, level)


def test_packed_forms_round_trip_through_the_prepared_cache(tmp_path):
    """A companion built once serves every packed form (QLinearConv, QGemm, the scalar parameters) from its
    bytes: the second session prepacks nothing and computes onnxruntime's integers."""
    import onnx
    import onnxruntime as ort

    from onnx_prepared.runtime import RuntimeSession

    rng = _rng("cache")
    init = {
        "xs": np.float32(0.05), "xz": np.uint8(3), "w": _ints(rng, np.int8, (6, 3, 3, 3), -63, 63),
        "ws": rng.uniform(0.002, 0.01, 6).astype(np.float32), "wz": np.zeros(6, np.int8),
        "ys": np.float32(0.4), "yz": np.uint8(9), "b": rng.integers(-900, 900, 6).astype(np.int32),
        "gb": _ints(rng, np.int8, (4, 6 * 16), -63, 63), "gs": np.float32(0.01), "gz": np.int8(0),
        "gc": rng.integers(-99, 99, 4).astype(np.int32),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"]),
        helper.make_node("QLinearConv", ["q", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["c"],
                         pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Flatten", ["c"], ["f"]),
        helper.make_node("QGemm", ["f", "ys", "yz", "gb", "gs", "gz", "gc"], ["g"], domain=MS, transB=1),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in init.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    path, companion = tmp_path / "m.onnx", tmp_path / "c" / "m.prepared.onnx"
    onnx.save(model, path)
    x = (rng.standard_normal((1, 3, 8, 8)) * 2).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    opts = {"prepared_model_path": str(companion)}
    with RuntimeSession(str(path), {**opts, "prepared_model_policy": "build_if_missing"}) as s:
        s.prepare()
        assert sum(1 for k in s.state.counters if k.startswith("prepack:")) == 3
    with RuntimeSession(str(path), {**opts, "prepared_model_policy": "read_only"}) as s:
        (y,) = s.run({"x": x})
        counters = dict(s.state.counters)
    assert not any(k.startswith("prepack:") for k in counters)
    assert sum(1 for k in counters if k.startswith("read_packed:")) == 3
    np.testing.assert_array_equal(y, ref)


@pytest.mark.skipif("avx512vnni" not in native.supported_levels(), reason="needs AVX-512 VNNI")
@pytest.mark.parametrize("seed", range(6))
def test_qconv_vnni_gives_qconv_bits(seed):
    """``qconv_vnni`` (uint8 x int8 vpdpbusd on channels-last blocks) against ``qconv`` (int16 pairs) on
    random geometries: strides 1-3, dilations, pads, channels not a multiple of 4, rows wider than 16,
    both input types, all three output modes and weights over the whole int8 range."""
    from onnx_prepared.kernels import _spatial as sp
    from onnx_prepared.kernels import qlinear_packed as QP

    ext = native._ext
    rng = _rng("vnni", seed)
    done = 0
    with native.forced_level("avx512vnni"):
        while done < 25:
            n, c, m = int(rng.integers(1, 3)), int(rng.integers(1, 40)), int(rng.integers(1, 70))
            kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            h, w = int(rng.integers(kh, 20)), int(rng.integers(kw, 40))
            strides, dilations = [int(v) for v in rng.integers(1, 4, 2)], [int(v) for v in rng.integers(1, 3, 2)]
            pads = [int(v) for v in rng.integers(0, 3, 4)]
            begins, _, out = sp.geometry("Conv", (h, w), (kh, kw), auto_pad="NOTSET", pads=pads, strides=strides,
                                         dilations=dilations)
            if min(out) < 1:
                continue
            xsigned, ymode = int(rng.integers(0, 2)), int(rng.integers(0, 3))
            xt = np.int8 if xsigned else np.uint8
            x = _ints(rng, xt, (n, c, h, w))
            wc = _ints(rng, np.int8, (m, c, kh, kw)).astype(np.int16)
            k = c * kh * kw
            w16 = np.zeros((m, k + k % 2), np.int16)
            w16[:, :k] = wc.reshape(m, k)
            zx = int(_ints(rng, xt, ()))
            zy = int(_ints(rng, np.int8 if ymode == 1 else np.uint8, ()))
            bias = rng.integers(-3000, 3000, m).astype(np.int32)
            scales = rng.uniform(1e-4, 1e-2, m).astype(np.float32)
            dims = np.array([n, c, h, w, 1, m, kh, kw, *out, *begins, *strides, *dilations, zx, zy, xsigned, ymode],
                            np.int64)
            yt = (np.uint8, np.int8, np.float32)[ymode]
            want, got = np.empty((n, m, *out), yt), np.empty((n, m, *out), yt)
            packed = QP.PackedQLinear(w16, bias, scales, zx, zy, (m, c, kh, kw))
            _, blocks, badj = QP._vnni_panels(packed, 1, x)
            ext.qconv(x, w16, bias, scales, want, dims)
            assert ext.qconv_vnni(x, blocks, badj, scales, got, dims)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
            done += 1


@pytest.mark.parametrize("level", native.supported_levels())
def test_qlookup_is_the_table_at_every_length(level):
    """``qlookup`` (AVX-512 VBMI 64 bytes at a time where the level and the CPU allow, else byte by byte)
    is ``table[x]`` for every length around its 64-byte blocks."""
    ext, rng = native._ext, _rng("lookup", level)
    table = _ints(rng, np.uint8, (256,))
    with native.forced_level(level):
        for n in (*range(0, 130), 4608):
            x = _ints(rng, np.uint8, (n,))
            y = np.empty_like(x)
            ext.qlookup(x, table, y)
            np.testing.assert_array_equal(y, table[x])
