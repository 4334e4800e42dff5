"""Which kernel module registers which ops, so a kernel module is imported only when a model uses it.

``import onnx_prepared`` imports no kernel module: :func:`onnx_prepared.kernels.registry.lookup` and
:func:`onnx_prepared.kernels.prepack.match` call :func:`ensure_loaded` for the op they are asked about,
which imports every module listed for it (a kernel and its prepack rule may live in two modules).
Registration itself stays ``@kernel``/``@prepack_rule`` at import of the module; this table only says
where to look. ``tests/kernels/test_catalog.py`` imports every module and asserts the table lists
exactly what they register: a new kernel or prepack rule is one line here.
"""

from __future__ import annotations

import importlib
import threading

#: module (in onnx_prepared.kernels) -> ops it registers, "domain:Op" outside the default domain.
MODULES: dict[str, tuple[str, ...]] = {
    "activation": ("Clip", "Elu", "Erf", "Gelu", "onnx_prepared:GeluErf", "HardSigmoid", "HardSwish", "Identity",
                   "LeakyRelu", "LogSoftmax", "PRelu", "Relu", "Selu", "Sigmoid", "Softmax", "Softplus", "Softsign",
                   "Tanh", "ThresholdedRelu", "onnx_prepared:ScaledMaskedSoftmax"),
    "attention": ("com.microsoft:GroupQueryAttention",),
    "cast": ("Cast", "CastLike"),
    "channel_norm": ("BatchNormalization", "InstanceNormalization"),
    "contrib_gelu": ("com.microsoft:BiasGelu", "com.microsoft:Gelu"),
    "conv": ("Conv",),
    "conv_prepacked": ("Conv",),
    "conv_fused": ("onnx_prepared:FusedConv",),
    "conv_transpose": ("ConvTranspose",),
    "detection": ("NonMaxSuppression", "TopK"),
    "dq_fold": ("DequantizeLinear",),
    "dq_matmul": ("onnx_prepared:DequantizeMatMul",),
    "einsum": ("Einsum",),
    "elementwise": ("Abs", "Add", "And", "Ceil", "Cos", "Div", "Equal", "Exp", "Floor", "Greater",
                    "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual", "Log", "Max", "Mean", "Min", "Mod",
                    "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal", "Round", "Sign", "Sin", "Sqrt", "Sub", "Sum",
                    "Xor"),
    "gather_block_quantized": ("com.microsoft:GatherBlockQuantized",),
    "gemm": ("Gemm", "MatMul"),
    "gemm_prepacked": ("Gemm", "MatMul"),
    "matmul_bias": ("onnx_prepared:MatMulBias",),
    "matmul_nbits": ("com.microsoft:MatMulNBits",),
    "normalization": ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
                      "com.microsoft:SimplifiedLayerNormalization", "com.microsoft:SkipLayerNormalization",
                      "com.microsoft:SkipSimplifiedLayerNormalization", "onnx_prepared:AddLayerNormalization"),
    "pad": ("Pad",),
    "pool": ("AveragePool", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "LpPool", "MaxPool"),
    "qlinear": ("com.microsoft:QGemm", "com.microsoft:QLinearAdd", "com.microsoft:QLinearGlobalAveragePool",
                "com.microsoft:QLinearMul", "QLinearConv", "QLinearMatMul"),
    "qlinear_packed": ("DequantizeLinear", "QLinearConv", "QuantizeLinear", "com.microsoft:QGemm",
                       "com.microsoft:QLinearAdd", "com.microsoft:QLinearGlobalAveragePool",
                       "com.microsoft:QLinearMul", "onnx_prepared:QLookup"),
    "quantize": ("DequantizeLinear", "QuantizeLinear"),
    "quantize_dynamic": ("DynamicQuantizeLinear", "MatMulInteger", "onnx_prepared:DynamicQuantizeMatMul"),
    "reduce": ("ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"),
    "resize": ("Resize", "Upsample"),
    "rnn": ("GRU", "LSTM", "RNN"),
    "rotary": ("RotaryEmbedding", "com.microsoft:RotaryEmbedding"),
    "shape_ops": ("Concat", "Constant", "ConstantOfShape", "Expand", "Flatten", "Gather", "Range", "Reshape",
                  "Shape", "Size", "Slice", "Split", "Squeeze", "Tile", "Transpose", "Trilu", "Unsqueeze", "Where",
                  "onnx_prepared:ReshapeFromShape"),
    "silu": ("onnx_prepared:SiLU",),
    "squeeze_excite": ("onnx_prepared:SqueezeExcite",),
}


def _key(name: str) -> tuple[str, str]:
    domain, _, op = name.rpartition(":")
    return domain, op


#: (normalized domain, op_type) -> modules to import before looking the op up.
BY_OP: dict[tuple[str, str], tuple[str, ...]] = {}
for _mod, _ops in MODULES.items():
    for _op in _ops:
        BY_OP[_key(_op)] = (*BY_OP.get(_key(_op), ()), _mod)

_loaded: set[tuple[str, str]] = set()
_lock = threading.RLock()


def ensure_loaded(domain: str, op_type: str) -> None:
    """Import the kernel modules that register ``(domain, op_type)`` (normalized domain); idempotent.

    Thread-safe: sessions may be built concurrently.
    """
    key = (domain, op_type)
    if key in _loaded:
        return
    with _lock:
        for mod in BY_OP.get(key, ()):
            importlib.import_module(f"onnx_prepared.kernels.{mod}")
        _loaded.add(key)


def load_all() -> None:
    """Import every kernel module (tools that list what exists)."""
    for mod in MODULES:
        importlib.import_module(f"onnx_prepared.kernels.{mod}")
