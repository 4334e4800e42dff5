"""A corpus of real exported models: torch/torchvision exports and onnxruntime.quantization's INT8 twin.

Every model is built offline by a public exporter (``torch.onnx.export`` with the TorchScript exporter,
``onnxruntime.quantization.quantize_dynamic``) with random weights from a fixed seed, into a folder the
caller gives (tests cache one per test session, see ``tests/corpus/conftest.py``). Each entry also
carries its feeds, so a test or benchmark can run it beside onnxruntime.

:data:`MODELS` maps a name to a builder ``(folder) -> CorpusModel``; builders import torch lazily.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

SEED = 0


@dataclass(frozen=True)
class CorpusModel:
    """One exported model: its file, the feed sets to run (first and later runs), and what it covers."""

    name: str
    path: str
    feeds: list[dict[str, np.ndarray]]
    kind: str  # "cnn", "rnn", "control", "transformer", "quantized": the benchmark's grouping
    covers: str
    extra: dict = field(default_factory=dict)


def _rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def _export(module, args, path: str, *, opset: int, input_names, output_names, dynamic_axes=None) -> str:
    """``torch.onnx.export`` (TorchScript exporter) of ``module`` in eval mode to ``path``."""
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notice of the TorchScript exporter, tracer warnings
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes or {}, do_constant_folding=True)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return path


def _seeded():
    import torch

    torch.manual_seed(SEED)
    return torch


def _images(shape, n: int = 2, seed: int = SEED) -> list[dict[str, np.ndarray]]:
    rng = _rng(seed)
    return [{"input": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


# ---- CNNs ----

def resnet18(folder: str) -> CorpusModel:
    torch = _seeded()
    import torchvision

    m = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    path = _export(m, (torch.zeros(1, 3, 64, 64),), os.path.join(folder, "resnet18.onnx"), opset=17,
                   input_names=["input"], output_names=["logits"], dynamic_axes={"input": {0: "batch"}})
    return CorpusModel("resnet18", path, _images((2, 3, 64, 64)), "cnn",
                       "torchvision ResNet-18, opset 17: Conv+BN folded, MaxPool, GlobalAveragePool, Gemm")


def mobilenet_v3(folder: str) -> CorpusModel:
    torch = _seeded()
    import torchvision

    m = torchvision.models.mobilenet_v3_small(weights=None, num_classes=10).eval()
    path = _export(m, (torch.zeros(1, 3, 64, 64),), os.path.join(folder, "mobilenet_v3.onnx"), opset=18,
                   input_names=["input"], output_names=["logits"])
    return CorpusModel("mobilenet_v3", path, _images((1, 3, 64, 64)), "cnn",
                       "torchvision MobileNetV3-small, opset 18: depthwise Conv, HardSwish, SE (HardSigmoid, Mul)")


def lraspp(folder: str) -> CorpusModel:
    torch = _seeded()
    import torchvision

    m = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=4).eval()

    class Out(torch.nn.Module):  # the dict output is not exportable as such
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)["out"]

    path = _export(Out(m), (torch.zeros(1, 3, 64, 64),), os.path.join(folder, "lraspp.onnx"), opset=17,
                   input_names=["input"], output_names=["out"])
    return CorpusModel("lraspp", path, _images((1, 3, 64, 64)), "cnn",
                       "torchvision LRASPP segmentation head, opset 17: bilinear Resize, AveragePool, Sigmoid gate")


def _small_unet(torch):
    nn = torch.nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc1, self.enc2 = block(3, 8), block(8, 16)
            self.pool = nn.MaxPool2d(2)
            self.mid = block(16, 16)
            self.up = nn.ConvTranspose2d(16, 16, 2, stride=2)
            self.dec2 = block(32, 8)
            self.dec1 = block(16, 8)
            self.head = nn.Conv2d(8, 3, 1)

        def forward(self, x):
            e1 = self.enc1(x)
            e2 = self.enc2(self.pool(e1))
            m = self.mid(self.pool(e2))
            d2 = self.dec2(torch.cat([self.up(m), e2], 1))
            d1 = self.dec1(torch.cat([nn.functional.interpolate(d2, scale_factor=2.0, mode="nearest"), e1], 1))
            return self.head(d1)

    return UNet()


def _randomize_bn(torch, m) -> None:
    """Non-trivial running statistics, so inference-mode and batch-statistics BatchNorm differ."""
    g = torch.Generator().manual_seed(SEED)
    for mod in m.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.5)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            mod.weight.data.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            mod.bias.data.copy_(torch.randn(mod.num_features, generator=g) * 0.1)


def unet(folder: str, opset: int = 11) -> CorpusModel:
    """UNet-style head with unfused BatchNormalization (``training=TrainingMode.PRESERVE`` in eval keeps
    BN nodes instead of folding them into Conv) at an old opset, ConvTranspose and nearest Resize."""
    torch = _seeded()
    m = _small_unet(torch).eval()
    _randomize_bn(torch, m)
    name = f"unet_opset{opset}"
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 3, 32, 32),), buf, dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["out"], do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE)
    path = os.path.join(folder, f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return CorpusModel(name, path, _images((1, 3, 32, 32)), "cnn",
                       f"UNet head at opset {opset}: BatchNormalization (inference), ConvTranspose, "
                       "nearest Resize/Upsample, MaxPool, Concat")


def bn_cnn(folder: str, opset: int = 9, *, dynamic_minus_one: bool = False) -> CorpusModel:
    """Conv/BatchNorm/AvgPool CNN ending in global max+avg pools; with ``dynamic_minus_one`` the input is
    rewritten ``[-1, 3, -1, -1]`` (paddle2onnx's way of writing dynamic dims) and fed two sizes."""
    torch = _seeded()
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.AvgPool2d(2), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16),
                                   nn.LeakyReLU(0.1))
            self.fc = nn.Linear(32, 5)

        def forward(self, x):
            y = self.f(x)
            pooled = torch.cat([nn.functional.adaptive_max_pool2d(y, 1), nn.functional.adaptive_avg_pool2d(y, 1)], 1)
            return self.fc(torch.flatten(pooled, 1))

    m = Net().eval()
    _randomize_bn(torch, m)
    name = "dynamic_minus_one" if dynamic_minus_one else f"bn_cnn_opset{opset}"
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 3, 16, 16),), buf, dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=["logits"], do_constant_folding=False,
                          training=torch.onnx.TrainingMode.PRESERVE,
                          dynamic_axes={"input": {0: "n", 2: "h", 3: "w"}, "logits": {0: "n"}})
    proto = onnx.load_from_string(buf.getvalue())
    feeds = _images((1, 3, 16, 16))
    if dynamic_minus_one:
        for vi in list(proto.graph.input) + list(proto.graph.output):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param"):
                    d.Clear()
                    d.dim_value = -1
        del proto.graph.value_info[:]
        feeds = _images((2, 3, 16, 16)) + _images((1, 3, 24, 20), n=1, seed=1)
    path = os.path.join(folder, f"{name}.onnx")
    onnx.save(proto, path)
    covers = (f"Conv/BatchNormalization/AveragePool CNN at opset {opset}, GlobalMax/AveragePool"
              + (", input dims written as dim_value -1" if dynamic_minus_one else ""))
    return CorpusModel(name, path, feeds, "cnn", covers)


# ---- RNNs and control flow ----

def lstm(folder: str) -> CorpusModel:
    torch = _seeded()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True)
            self.out = torch.nn.Linear(32, 4)

        def forward(self, x, h0, c0):
            y, (h, c) = self.rnn(x, (h0, c0))
            return self.out(y), h, c

    rng = _rng()
    feeds = [{"x": rng.standard_normal((6, 2, 8)).astype(np.float32),
              "h0": rng.standard_normal((4, 2, 16)).astype(np.float32),
              "c0": rng.standard_normal((4, 2, 16)).astype(np.float32)} for _ in range(2)]
    z = {k: torch.from_numpy(v) for k, v in feeds[0].items()}
    path = _export(Net().eval(), (z["x"], z["h0"], z["c0"]), os.path.join(folder, "lstm.onnx"), opset=17,
                   input_names=["x", "h0", "c0"], output_names=["y", "h", "c"],
                   dynamic_axes={"x": {0: "seq", 1: "batch"}, "h0": {1: "batch"}, "c0": {1: "batch"}})
    return CorpusModel("lstm", path, feeds, "rnn", "2-layer bidirectional LSTM with initial h0/c0, opset 17")


def gru(folder: str) -> CorpusModel:
    torch = _seeded()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(8, 16, num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x, h0):
            return self.rnn(x, h0)

    rng = _rng(1)
    feeds = [{"x": rng.standard_normal((2, 7, 8)).astype(np.float32),
              "h0": rng.standard_normal((4, 2, 16)).astype(np.float32)} for _ in range(2)]
    z = {k: torch.from_numpy(v) for k, v in feeds[0].items()}
    path = _export(Net().eval(), (z["x"], z["h0"]), os.path.join(folder, "gru.onnx"), opset=14,
                   input_names=["x", "h0"], output_names=["y", "h"])
    return CorpusModel("gru", path, feeds, "rnn", "2-layer bidirectional batch-first GRU with initial h0, opset 14")


def loop_if(folder: str) -> CorpusModel:
    """``torch.jit.script`` control flow: a data-dependent ``if`` inside a ``for`` loop -> If inside Loop."""
    torch = _seeded()

    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, n):
            for i in range(int(n)):
                if bool(x.sum() > 0):
                    x = torch.tanh(self.lin(x)) - 0.25
                else:
                    x = x * 0.5 + float(i)
            return x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation notice
        scripted = torch.jit.script(Body().eval())
    rng = _rng(2)
    feeds = [{"x": rng.standard_normal((3, 4)).astype(np.float32), "n": np.array(5, np.int64)},
             {"x": -np.abs(rng.standard_normal((3, 4))).astype(np.float32), "n": np.array(3, np.int64)}]
    path = _export(scripted, (torch.from_numpy(feeds[0]["x"]), torch.tensor(5)), os.path.join(folder, "loop_if.onnx"),
                   opset=17, input_names=["x", "n"], output_names=["y"])
    return CorpusModel("loop_if", path, feeds, "control", "torch.jit.script: If inside Loop, opset 17")


# ---- transformers ----

def _bert(torch, vocab=100, hidden=32, heads=4, layers=2, seq=8):
    nn = torch.nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.ff1, self.ff2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
            self.act = nn.GELU()  # exact: Erf at opset < 20

        def forward(self, x, bias):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, s, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / (hidden // heads) ** 0.5 + bias, dim=-1)
            x = self.ln1(x + self.proj((att @ v).transpose(1, 2).reshape(b, s, hidden)))
            return self.ln2(x + self.ff2(self.act(self.ff1(x))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
            self.ln = nn.LayerNorm(hidden)
            self.layers = nn.ModuleList([Layer() for _ in range(layers)])
            self.pool = nn.Linear(hidden, hidden)

        def forward(self, input_ids, attention_mask):
            pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
            x = self.ln(self.tok(input_ids) + self.pos(pos))
            bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            return x, torch.tanh(self.pool(x[:, 0]))

    return Bert()


def _bert_feeds(seq=8) -> list[dict[str, np.ndarray]]:
    rng = _rng(3)
    out = []
    for lengths in ((8, 5), (3, 8)):
        ids = rng.integers(0, 100, (2, seq)).astype(np.int64)
        mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def bert(folder: str) -> CorpusModel:
    torch = _seeded()
    feeds = _bert_feeds()
    z = {k: torch.from_numpy(v) for k, v in feeds[0].items()}
    path = _export(_bert(torch).eval(), (z["input_ids"], z["attention_mask"]), os.path.join(folder, "bert.onnx"),
                   opset=17, input_names=["input_ids", "attention_mask"], output_names=["last_hidden", "pooled"],
                   dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    return CorpusModel("bert", path, feeds, "transformer",
                       "BERT-style encoder, opset 17: LayerNormalization, Erf GELU, additive attention mask, Softmax")


def bert_int8(folder: str) -> CorpusModel:
    """``onnxruntime.quantization.quantize_dynamic`` of :func:`bert`: MatMulInteger + DynamicQuantizeLinear."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = os.path.join(folder, "bert.onnx")
    if not os.path.exists(src):
        bert(folder)
    path = os.path.join(folder, "bert_int8.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(src, path, weight_type=QuantType.QInt8)
    return CorpusModel("bert_int8", path, _bert_feeds(), "quantized",
                       "quantize_dynamic INT8 twin of bert: DynamicQuantizeLinear, MatMulInteger, Cast/Mul rescale")


def bert_ort_optimized(folder: str) -> CorpusModel:
    """onnxruntime.transformers' optimizer (``model_type="bert"``, python fusions only) on :func:`bert`:
    com.microsoft SkipLayerNormalization and BiasGelu, as a BERT deployment pipeline writes them."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    src = os.path.join(folder, "bert.onnx")
    if not os.path.exists(src):
        bert(folder)
    path = os.path.join(folder, "bert_ort_optimized.onnx")
    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimize_model(src, model_type="bert", num_heads=4, hidden_size=32, opt_level=0).save_model_to_file(path)
    finally:
        logger.setLevel(level)
    return CorpusModel("bert_ort_optimized", path, _bert_feeds(), "transformer",
                       "onnxruntime.transformers optimizer output: SkipLayerNormalization, BiasGelu")


def _small_se_cnn(torch):
    """Conv/BN/ReLU, a strided residual block and a squeeze-excite gate (HardSigmoid), GAP, Linear."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1))
            self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(32, 8, 1), nn.ReLU(), nn.Conv2d(8, 32, 1),
                                    nn.Hardsigmoid())
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            y = self.down(self.stem(x))
            y = y + self.body(y)
            y = y * self.se(y)
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

    m = Net().eval()
    _randomize_bn(torch, m)
    return m


def cnn_int8(folder: str, fmt: str) -> CorpusModel:
    """``onnxruntime.quantization.quantize_static`` of a small SE CNN, QOperator (QLinearConv, QLinearAdd,
    QLinearMul, QLinearGlobalAveragePool, QGemm) or QDQ format; uint8 activations, int8 weights with
    ``reduce_range`` (7-bit), which keeps onnxruntime's u8 x s8 GEMM from saturating on CPUs without VNNI."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    torch = _seeded()
    name = f"cnn_int8_{fmt.lower()}"
    src = os.path.join(folder, f"{name}_fp32.onnx")  # per format: two builders may run at once
    pre = os.path.join(folder, f"{name}_pre.onnx")
    path = os.path.join(folder, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not os.path.exists(pre):
            torch.onnx.export(_small_se_cnn(torch), (torch.zeros(1, 3, 24, 24),), src, dynamo=False,
                              opset_version=17, input_names=["input"], output_names=["logits"])
            quant_pre_process(src, pre)

        class Calibration(CalibrationDataReader):
            def __init__(self):
                self.feeds = iter(_images((1, 3, 24, 24), n=4, seed=7))

            def get_next(self):
                return next(self.feeds, None)

        quantize_static(pre, path, Calibration(), quant_format=getattr(QuantFormat, fmt),
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range=True)
    covers = ("quantize_static QOperator: QLinearConv, com.microsoft QLinearAdd/QLinearMul/"
              "QLinearGlobalAveragePool/QGemm" if fmt == "QOperator" else
              "quantize_static QDQ: QuantizeLinear/DequantizeLinear around float Conv/Add/Mul/Gemm")
    return CorpusModel(name, path, _images((1, 3, 24, 24)), "quantized", covers)


MODELS: dict[str, Callable[[str], CorpusModel]] = {
    "resnet18": resnet18,
    "mobilenet_v3": mobilenet_v3,
    "lraspp": lraspp,
    "unet_opset11": lambda d: unet(d, 11),
    "bn_cnn_opset9": lambda d: bn_cnn(d, 9),
    "bn_cnn_opset13": lambda d: bn_cnn(d, 13),
    "dynamic_minus_one": lambda d: bn_cnn(d, 11, dynamic_minus_one=True),
    "lstm": lstm,
    "gru": gru,
    "loop_if": loop_if,
    "bert": bert,
    "bert_int8": bert_int8,
    "bert_ort_optimized": bert_ort_optimized,
    "cnn_int8_qoperator": lambda d: cnn_int8(d, "QOperator"),
    "cnn_int8_qdq": lambda d: cnn_int8(d, "QDQ"),
}


def ort_session(path: str):
    """onnxruntime's session on one thread, warnings off: the reference for values and timings."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def reference_path(path: str) -> str:
    """The model onnxruntime should run as the reference for ``path``: itself, or, where onnxruntime's
    u8 x s8 GEMM saturates on this CPU, a twin with exact int32 ``MatMulInteger`` (:mod:`tests.helpers.ort_int8`)."""
    from tests.helpers.ort_int8 import exact_matmul_integer_model, ort_u8s8_saturates

    if ort_u8s8_saturates() and any(n.op_type == "MatMulInteger"
                                    for n in onnx.load(path, load_external_data=False).graph.node):
        return exact_matmul_integer_model(path)
    return path


def assert_matches(name: str, ours: list, ref: list, atol: float = 1e-4, rtol: float = 1e-3) -> None:
    """Same count, shapes and dtypes; floats within ``atol + rtol*|ref|``, integers and bools exactly."""
    assert len(ours) == len(ref), f"{name}: {len(ours)} outputs, onnxruntime gives {len(ref)}"
    for i, (o, r) in enumerate(zip(ours, ref)):
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape and o.dtype == r.dtype, f"{name} output {i}: {o.dtype}{o.shape} vs {r.dtype}{r.shape}"
        if r.dtype.kind in "fc":
            np.testing.assert_allclose(o, r, atol=atol, rtol=rtol, err_msg=f"{name} output {i}")
        else:
            np.testing.assert_array_equal(o, r, err_msg=f"{name} output {i}")


def max_errors(ours: list, ref: list) -> tuple[float, float]:
    """(max abs error, max relative error) over all float outputs (integers: mismatching elements count 1)."""
    abs_e = rel_e = 0.0
    for o, r in zip(ours, ref):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        if o.shape != r.shape:
            return float("inf"), float("inf")
        if o.size:
            d = np.abs(o - r)
            abs_e = max(abs_e, float(d.max()))
            rel_e = max(rel_e, float((d / np.maximum(np.abs(r), 1e-6)).max()))
    return abs_e, rel_e
