"""Every corpus model (torch/torchvision exports, onnxruntime.quantization) against onnxruntime.

Each feed set runs twice through one session: the first run is cold (weights still being read and
prepacked), the second takes the hot path; both must match onnxruntime within atol 1e-4 + rtol 1e-3
(integers exactly).
"""

from __future__ import annotations

import contextlib

import pytest

pytest.importorskip("torch")

import onnx_prepared
from tests.helpers.corpus import MODELS, assert_matches, ort_session, reference_path

# model -> why it does not match yet (strict: a fix turns the xfail into a failure until removed here).
KNOWN: dict[str, str] = {}


def _params():
    for name in MODELS:
        marks = (pytest.mark.xfail(strict=True, reason=KNOWN[name]),) if name in KNOWN else ()
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", list(_params()))
def test_matches_onnxruntime_first_and_later_runs(corpus, name):
    cm = corpus(name)
    ref = ort_session(reference_path(cm.path))
    sess = onnx_prepared.InferenceSession(cm.path)
    for i, feeds in enumerate(cm.feeds):
        expected = ref.run(None, feeds)
        for attempt in ("first", "later"):
            assert_matches(f"{name} feeds {i} ({attempt} run)", sess.run(None, feeds), expected)


def test_metadata_matches_onnxruntime(corpus):
    """get_inputs()/get_outputs(): names, shapes (ints, names, None) and type strings as onnxruntime prints them."""
    for name in ("dynamic_minus_one", "lstm", "bert", "loop_if", "lraspp"):
        cm = corpus(name)
        ref = ort_session(cm.path)
        sess = onnx_prepared.InferenceSession(cm.path)
        for ours, theirs in ((sess.get_inputs(), ref.get_inputs()), (sess.get_outputs(), ref.get_outputs())):
            assert [(a.name, a.shape, a.type) for a in ours] == [(b.name, b.shape, b.type) for b in theirs], name


def test_corpus_covers_the_issue(corpus):
    """The exported graphs really contain the ops the corpus is meant to cover."""
    import onnx

    def ops(name):
        def walk(g):
            for n in g.node:
                yield n.op_type
                for a in n.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        yield from (f"{n.op_type}/{o}" for o in walk(a.g))
        return set(walk(onnx.load(corpus(name).path).graph))

    assert {"HardSwish", "HardSigmoid", "Mul", "GlobalAveragePool"} <= ops("mobilenet_v3")
    assert "Resize" in ops("lraspp")
    assert {"ConvTranspose", "BatchNormalization", "Resize"} <= ops("unet_opset11")
    assert {"BatchNormalization", "GlobalMaxPool"} <= ops("bn_cnn_opset9")
    assert {"LSTM"} <= ops("lstm") and {"GRU"} <= ops("gru")
    assert "Loop/If" in ops("loop_if")
    assert {"LayerNormalization", "Erf", "Softmax"} <= ops("bert")
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops("bert_int8")
    assert {"QLinearConv", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QGemm"} <= ops("cnn_int8_qoperator")
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Add", "Mul", "Gemm"} <= ops("cnn_int8_qdq")
    assert {"SkipLayerNormalization", "BiasGelu"} <= ops("bert_ort_optimized")
    m = onnx.load(corpus("dynamic_minus_one").path)
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [-1, 3, -1, -1]
    for name in ("unet_opset11", "bn_cnn_opset9", "bn_cnn_opset13"):
        assert onnx.load(corpus(name).path).opset_import[0].version <= 13


# model -> ops that still run on the onnx.reference fallback (every other op has a kernel of ours)
ON_FALLBACK: dict[str, set[str]] = {}


@pytest.mark.parametrize("name", list(MODELS))
def test_ops_on_the_fallback_are_the_known_ones(corpus, name):
    from onnx_prepared.bind.reference import FALLBACK_CALLS

    cm = corpus(name)
    sess = onnx_prepared.InferenceSession(cm.path)
    sess.run(None, cm.feeds[0])
    before = dict(FALLBACK_CALLS)
    sess.run(None, cm.feeds[0])
    used = {k.split("::", 1)[-1].split("-")[0] for k, v in FALLBACK_CALLS.items() if v != before.get(k, 0)}
    assert used == ON_FALLBACK.get(name, set()), name


def _levels():
    from onnx_prepared.kernels import native

    return native.supported_levels() or ("numpy",)


@pytest.mark.parametrize("level", _levels())
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_recurrent_models_at_every_dispatch_level(corpus, name, level):
    from onnx_prepared.kernels import native

    cm = corpus(name)
    ref = ort_session(cm.path)
    sess = onnx_prepared.InferenceSession(cm.path)
    with native.forced_level(level) if native.available() else contextlib.nullcontext():
        for i, feeds in enumerate(cm.feeds):
            expected = ref.run(None, feeds)
            for attempt in ("first", "later"):
                assert_matches(f"{name} at {level}, feeds {i} ({attempt} run)", sess.run(None, feeds), expected)
