"""The spec's tiny INT4 decoder-only LLM, laid out like an onnxruntime-genai INT4 CPU export.

Graph (L = layers; names follow genai's builder so tooling written for genai models applies)::

    inputs : input_ids int64 [batch, seq], attention_mask int64 [batch, total_seq],
             past_key_values.{i}.key/.value float32 [batch, kv_heads, past_seq, head_dim]
    outputs: logits float32 [batch, seq, vocab],
             present.{i}.key/.value float32 [batch, kv_heads, total_seq, head_dim]

    attention_mask -> ReduceSum(axis 1) -> Sub 1 -> Cast int32        = seqlens_k      [batch]
    attention_mask -> Shape -> Gather 1 -> Cast int32                 = total_seq_len  scalar
    lm_head weight -> Reshape [V, H/2] -> GatherBlockQuantized(input_ids)   tied INT4 embedding, or
    (embedding="fp32") model.embed_tokens.weight -> Gather(input_ids)     untied float32 table
    per layer i:
      (i == 0) SimplifiedLayerNormalization | (i > 0) SkipSimplifiedLayerNormalization (residual add)
      MatMulNBits qkv_proj -> GroupQueryAttention(do_rotary=1, cos/sin caches, past/present KV)
      MatMulNBits o_proj -> SkipSimplifiedLayerNormalization (residual add)
      MatMulNBits gate_up_proj -> Slice gate | Slice up -> Sigmoid, Mul (SiLU) -> Mul -> MatMulNBits down_proj
    SkipSimplifiedLayerNormalization (final norm) -> MatMulNBits lm_head -> logits (tied: the embedding's weight)

Departures from a current genai export, all deliberate: gate and up are one fused ``gate_up_proj``
MatMulNBits followed by two Slices (the spec's ``layer0.gate_up``; genai's Phi-3-era packed-MLP
form) where today's builder emits two MatMuls; ``SimplifiedLayerNormalization`` stays in the default
domain as genai puts it, which plain ``onnx.checker`` rejects (see :mod:`.checker`). Weights are
random (normal, std ``init_std``), quantized symmetrically (genai's default ``int4_is_symmetric``)
with float32 scales, since MatMulNBits' scales share the float32 activation type.

The payload is one external-data file with every tensor 4096-aligned and sha256-checksummed
(:mod:`.external`). Generation streams each weight in row chunks, so peak memory is a few chunks,
not the model.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_prepared.generate.config import CONFIG_KEY, FORMAT_VERSION, GENERATOR_KEY, TinyLlmConfig
from onnx_prepared.generate.external import ExternalDataWriter
from onnx_prepared.generate.quantize import quantize_int4

MODEL_FILE = "tiny-llm.onnx"
DATA_FILE = "tiny-llm.data"
GENAI_CONFIG_FILE = "genai_config.json"
LOGICAL_NAME_KEY = "onnx_prepared.logical_name"
LOGICAL_PART_KEY = "onnx_prepared.logical_part"
LOGICAL_MAP_KEY = "onnx_prepared.logical_names"
MS = "com.microsoft"
_CHUNK_ELEMS = 1 << 22  # float32 elements generated per chunk (16 MiB) while streaming one weight


# **** initializer names (genai's shared-embedding / RTN naming) ****


EMBED_TABLE = "model.embed_tokens.weight"  # the untied float32 embedding (embedding="fp32")


def weight_names(config: TinyLlmConfig, logical: str) -> tuple[str, str]:
    """(packed INT4 initializer, scales initializer) of one logical projection such as ``layer0.qkv``.

    ``emb`` (tied) and ``lm_head`` (untied) both name the LM head.
    """
    if logical in ("emb", "lm_head"):
        base = "lm_head.MatMul"
    else:
        layer, proj = logical.split(".")
        sub = {"qkv": "attn.qkv_proj", "attn_out": "attn.o_proj", "gate_up": "mlp.gate_up_proj",
               "down": "mlp.down_proj"}[proj]
        base = f"model.layers.{layer.removeprefix('layer')}.{sub}.MatMul"
    return f"{base}.weight_Q4G{config.block_size}", f"{base}.weight_scale"


def _norm_names(config: TinyLlmConfig) -> list[tuple[str, str]]:
    out = []
    for i in range(config.layers):
        out.append((f"layer{i}.input_norm", f"model.layers.{i}.input_layernorm.weight"))
        out.append((f"layer{i}.post_attention_norm", f"model.layers.{i}.post_attention_layernorm.weight"))
    out.append(("final_norm", f"model.layers.{config.layers}.final_norm_layernorm.weight"))
    return out


# **** weights ****


def _rng(config: TinyLlmConfig, logical: str) -> np.random.Generator:
    # One stream per logical tensor: its bytes depend only on (seed, name, shape), not on file order.
    return np.random.default_rng([config.seed, zlib.crc32(logical.encode())])


def _int4_chunks(config: TinyLlmConfig, logical: str, k: int, n: int, scales: list[np.ndarray]) -> Iterator:
    rng = _rng(config, logical)
    rows = max(1, _CHUNK_ELEMS // k)
    std = np.float32(config.init_std)
    for r0 in range(0, n, rows):
        w = rng.standard_normal((min(rows, n - r0), k), dtype=np.float32)
        w *= std
        packed, s = quantize_int4(w, config.block_size)
        scales.append(s)
        yield packed


def _rope_caches(config: TinyLlmConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [context_length, head_dim / 2], as genai's make_rotary_embedding_caches (non-interleaved)."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    freqs = np.outer(np.arange(config.context_length, dtype=np.float32), inv_freq.astype(np.float32))
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _write_weights(config: TinyLlmConfig, writer: ExternalDataWriter,
                   progress: Callable[[int, int], Any] | None = None) -> list[TensorProto]:
    """Stream every initializer into ``writer`` in first-use order; returns their TensorProtos.

    ``progress(done, total)`` is called after each block (total: the number of blocks).
    """
    inits: list[TensorProto] = []
    norms = dict(_norm_names(config))

    def projection(logical: str, k: int, n: int) -> None:
        wname, sname = weight_names(config, logical)
        scales: list[np.ndarray] = []
        bs = config.block_size
        inits.append(writer.add(wname, TensorProto.UINT8, (n, k // bs, bs // 2),
                                _int4_chunks(config, logical, k, n, scales),
                                {LOGICAL_NAME_KEY: logical, LOGICAL_PART_KEY: "int4"}))
        inits.append(writer.add(sname, TensorProto.FLOAT, (n, k // bs), scales,
                                {LOGICAL_NAME_KEY: logical, LOGICAL_PART_KEY: "scales"}))

    def norm(logical: str) -> None:
        g = _rng(config, logical).standard_normal(config.hidden, dtype=np.float32)
        g *= np.float32(0.1)
        g += np.float32(1.0)
        inits.append(writer.add(norms[logical], TensorProto.FLOAT, (config.hidden,), [g],
                                {LOGICAL_NAME_KEY: logical, LOGICAL_PART_KEY: "weight"}))

    if config.tied:
        projection("emb", config.hidden, config.vocab)
    else:
        inits.append(writer.add(EMBED_TABLE, TensorProto.FLOAT, (config.vocab, config.hidden),
                                _fp32_chunks(config, "emb", config.vocab, config.hidden),
                                {LOGICAL_NAME_KEY: "emb", LOGICAL_PART_KEY: "weight"}))
    cos, sin = _rope_caches(config)
    for name, arr in (("cos_cache", cos), ("sin_cache", sin)):
        inits.append(writer.add(name, TensorProto.FLOAT, arr.shape, [arr],
                                {LOGICAL_NAME_KEY: f"rope.{name.removesuffix('_cache')}", LOGICAL_PART_KEY: "weight"}))
    proj = {name: (k, n) for name, k, n in config.projections()}
    for i in range(config.layers):
        norm(f"layer{i}.input_norm")
        projection(f"layer{i}.qkv", *proj[f"layer{i}.qkv"])
        projection(f"layer{i}.attn_out", *proj[f"layer{i}.attn_out"])
        norm(f"layer{i}.post_attention_norm")
        projection(f"layer{i}.gate_up", *proj[f"layer{i}.gate_up"])
        projection(f"layer{i}.down", *proj[f"layer{i}.down"])
        if progress is not None:
            progress(i + 1, config.layers)
    norm("final_norm")
    if not config.tied:
        projection("lm_head", config.hidden, config.vocab)
    return inits


def _fp32_chunks(config: TinyLlmConfig, logical: str, rows: int, cols: int) -> Iterator[np.ndarray]:
    rng = _rng(config, logical)
    step = max(1, _CHUNK_ELEMS // cols)
    std = np.float32(config.init_std)
    for r0 in range(0, rows, step):
        w = rng.standard_normal((min(step, rows - r0), cols), dtype=np.float32)
        w *= std
        yield w


# **** graph ****


class _Graph:
    """Node list plus genai-style Constant nodes (``/model/constants/INT64/[1]``), created once each."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self._consts: set[str] = set()

    def const(self, value: int | list[int]) -> str:
        name = f"/model/constants/INT64/{value}".replace(" ", "")
        if name not in self._consts:
            self._consts.add(name)
            arr = np.array(value, dtype=np.int64)
            t = helper.make_tensor("value", TensorProto.INT64, arr.shape, arr.ravel().tolist())
            self.nodes.append(helper.make_node("Constant", [], [name], name=name.replace("constants", "constant_nodes"),
                                               value=t))
        return name

    def node(self, op: str, inputs: list[str], name: str, *, outputs: list[str] | None = None,
             domain: str = "", logical: str | None = None, **attrs) -> str:
        outs = outputs if outputs is not None else [f"{name}/output_0"]
        n = helper.make_node(op, inputs, outs, name=name, domain=domain or None, **attrs)
        if logical:
            p = n.metadata_props.add()
            p.key, p.value = LOGICAL_NAME_KEY, logical
        self.nodes.append(n)
        return outs[0]


def _matmul_nbits(g: _Graph, config: TinyLlmConfig, x: str, logical: str, name: str, k: int, n: int,
                  output: str | None = None) -> str:
    w, s = weight_names(config, logical)
    return g.node("MatMulNBits", [x, w, s], name, outputs=[output] if output else None, domain=MS, logical=logical,
                  K=k, N=n, bits=4, block_size=config.block_size, accuracy_level=config.accuracy_level)


def _build_nodes(config: TinyLlmConfig) -> list[onnx.NodeProto]:
    c, g = config, _Graph()
    norms = dict(_norm_names(c))
    eps = float(np.float32(c.rms_eps))

    # Attention-mask preprocessing, exactly genai's make_attention_mask_standard_reformatting_for_gqa.
    mb = "/model/attn_mask_reformat/attn_mask_subgraph"
    rs = g.node("ReduceSum", ["attention_mask", g.const([1])], f"{mb}/ReduceSum", keepdims=0)
    sub = g.node("Sub", [rs, g.const([1])], f"{mb}/Sub")
    seqlens_k = g.node("Cast", [sub], f"{mb}/Sub/Cast", to=TensorProto.INT32)
    shape = g.node("Shape", ["attention_mask"], f"{mb}/Shape")
    total = g.node("Gather", [shape, g.const(1)], f"{mb}/Gather", axis=0)
    total_seq_len = g.node("Cast", [total], f"{mb}/Gather/Cast", to=TensorProto.INT32)

    if c.tied:
        # Tied INT4 embedding: the LM head's packed weight, viewed as [V, H/2], gathered by token id.
        lm_w, lm_s = weight_names(c, "emb")
        flat = g.node("Reshape", [lm_w, g.const([c.vocab, c.hidden // 2])], "/model/embed_tokens/Reshape")
        x = g.node("GatherBlockQuantized", [flat, "input_ids", lm_s], "/model/embed_tokens/GatherBlockQuantized",
                   domain=MS, logical="emb", bits=4, block_size=c.block_size, gather_axis=0, quantize_axis=1)
    else:
        x = g.node("Gather", [EMBED_TABLE, "input_ids"], "/model/embed_tokens/Gather", logical="emb", axis=0)

    residual, skip = x, None
    for i in range(c.layers):
        p = f"/model/layers.{i}"
        # input norm: plain RMSNorm for layer 0, otherwise residual add + RMSNorm in one op
        if skip is None:
            h = g.node("SimplifiedLayerNormalization", [residual, norms[f"layer{i}.input_norm"]],
                       f"{p}/input_layernorm/LayerNorm", outputs=[f"{p}/input_layernorm/output_0"],
                       logical=f"layer{i}.input_norm", epsilon=eps, axis=-1, stash_type=1)
        else:
            h, residual = _skip_norm(g, residual, skip, norms[f"layer{i}.input_norm"], f"{p}/input_layernorm",
                                     f"layer{i}.input_norm", eps)
        qkv = _matmul_nbits(g, c, h, f"layer{i}.qkv", f"{p}/attn/qkv_proj/MatMulNBits", c.hidden, c.qkv_out)
        attn = g.node(
            "GroupQueryAttention",
            [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens_k, total_seq_len,
             "cos_cache", "sin_cache"],
            f"{p}/attn/GroupQueryAttention",
            outputs=[f"{p}/attn/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"],
            domain=MS, logical=f"layer{i}.attention",
            num_heads=c.heads, kv_num_heads=c.kv_heads, scale=float(np.float32(1.0 / np.sqrt(c.head_dim))),
            local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0,
        )
        o = _matmul_nbits(g, c, attn, f"layer{i}.attn_out", f"{p}/attn/o_proj/MatMulNBits", c.hidden, c.hidden)
        h, residual = _skip_norm(g, residual, o, norms[f"layer{i}.post_attention_norm"],
                                 f"{p}/post_attention_layernorm", f"layer{i}.post_attention_norm", eps)
        gu = _matmul_nbits(g, c, h, f"layer{i}.gate_up", f"{p}/mlp/gate_up_proj/MatMulNBits", c.hidden,
                           2 * c.intermediate)
        axes = g.const([-1])
        gate = g.node("Slice", [gu, g.const([0]), g.const([c.intermediate]), axes], f"{p}/mlp/gate_proj/Slice")
        up = g.node("Slice", [gu, g.const([c.intermediate]), g.const([2 * c.intermediate]), axes],
                    f"{p}/mlp/up_proj/Slice")
        sig = g.node("Sigmoid", [gate], f"{p}/mlp/act_fn/Sigmoid")
        act = g.node("Mul", [gate, sig], f"{p}/mlp/act_fn/Mul")
        prod = g.node("Mul", [act, up], f"{p}/mlp/Mul")
        skip = _matmul_nbits(g, c, prod, f"layer{i}.down", f"{p}/mlp/down_proj/MatMulNBits", c.intermediate,
                             c.hidden)

    p = f"/model/layers.{c.layers}/final_norm_layernorm"
    h = g.node("SkipSimplifiedLayerNormalization", [residual, skip, norms["final_norm"]], f"{p}/SkipLayerNorm",
               outputs=[f"{p}/output_0"], domain=MS, logical="final_norm", epsilon=eps)
    _matmul_nbits(g, c, h, "emb" if c.tied else "lm_head", "/lm_head/MatMulNBits", c.hidden, c.vocab,
                  output="logits")
    return g.nodes


def _skip_norm(g: _Graph, residual: str, skip: str, weight: str, prefix: str, logical: str,
               eps: float) -> tuple[str, str]:
    """SkipSimplifiedLayerNormalization: returns (normalized output 0, residual sum output 3)."""
    out0, out3 = f"{prefix}/output_0", f"{prefix}/output_3"
    g.node("SkipSimplifiedLayerNormalization", [residual, skip, weight], f"{prefix}/SkipLayerNorm",
           outputs=[out0, "", "", out3], domain=MS, logical=logical, epsilon=eps)
    return out0, out3


def build_model(config: TinyLlmConfig, initializers: list[TensorProto]) -> onnx.ModelProto:
    """The ModelProto around already-written initializers (no weight bytes pass through here)."""
    c = config
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_past = ["batch_size", c.kv_heads, "past_sequence_length", c.head_dim]
    kv_total = ["batch_size", c.kv_heads, "total_sequence_length", c.head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch_size", "sequence_length", c.vocab])]
    for i in range(c.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, kv_past))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32, kv_total))
    graph = helper.make_graph(_build_nodes(c), "main_graph", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10, producer_name="onnx-prepared tiny-llm generator",
                              producer_version=str(FORMAT_VERSION))
    logical: dict[str, list[str]] = {}
    for t in initializers:
        name = next(p.value for p in t.metadata_props if p.key == LOGICAL_NAME_KEY)
        logical.setdefault(name, []).append(t.name)
    helper.set_model_props(model, {
        GENERATOR_KEY: f"tiny-llm/{FORMAT_VERSION}",
        CONFIG_KEY: c.to_json(),
        LOGICAL_MAP_KEY: json.dumps(logical, sort_keys=True),
    })
    return model


def genai_config(config: TinyLlmConfig) -> dict:
    """A genai_config.json for the model (decoder section as genai's builder writes it)."""
    c = config
    return {
        "model": {
            "bos_token_id": 1,
            "context_length": c.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": MODEL_FILE,
                "head_size": c.head_dim,
                "hidden_size": c.hidden,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": c.heads,
                "num_hidden_layers": c.layers,
                "num_key_value_heads": c.kv_heads,
            },
            "eos_token_id": 2,
            "pad_token_id": 2,
            "type": "llama",
            "vocab_size": c.vocab,
        },
        "search": {"do_sample": False, "max_length": c.context_length, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": True, "temperature": 1.0,
                   "top_k": 1, "top_p": 1.0, "repetition_penalty": 1.0},
    }


def write_tiny_llm(config: TinyLlmConfig, out_dir: str | os.PathLike,
                   progress: Callable[[int, int], Any] | None = None) -> str:
    """Write ``tiny-llm.onnx``, ``tiny-llm.data`` and ``genai_config.json`` into ``out_dir``; returns the .onnx path.

    ``progress(done, total)`` is called as blocks are written (silent when None).
    """
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    writer = ExternalDataWriter(os.path.join(out_dir, DATA_FILE), DATA_FILE)
    try:
        inits = _write_weights(config, writer, progress)
    except BaseException:
        writer.abort()
        raise
    writer.close()
    model = build_model(config, inits)
    path = os.path.join(out_dir, MODEL_FILE)
    _atomic_write(path, model.SerializeToString())
    _atomic_write(os.path.join(out_dir, GENAI_CONFIG_FILE),
                  (json.dumps(genai_config(config), indent=4, sort_keys=True) + "\n").encode())
    return path


def _atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def generate_tiny_llm(
    out_dir: str | os.PathLike,
    *,
    config: TinyLlmConfig | None = None,
    preset: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    intermediate: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    vocab: int | None = None,
    seed: int | None = None,
    block_size: int | None = None,
    context_length: int | None = None,
    accuracy_level: int | None = None,
    embedding: str | None = None,
) -> str:
    """Generate the tiny INT4 LLM into ``out_dir`` and return the path of its ``tiny-llm.onnx``.

    ``preset`` (``tiny`` default, ``medium``, ``large``) picks the base dimensions; any explicit
    argument overrides it; ``embedding="fp32"`` gives genai's untied float32 embedding and a separate
    INT4 LM head. Same arguments give byte-identical files.

    >>> path = generate_tiny_llm("/tmp/llm", layers=2, hidden=64, intermediate=128, heads=4,
    ...                          kv_heads=2, vocab=256)  # doctest: +SKIP
    """
    overrides = dict(layers=layers, hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads,
                     vocab=vocab, seed=seed, block_size=block_size, context_length=context_length,
                     accuracy_level=accuracy_level, embedding=embedding)
    if config is None:
        config = TinyLlmConfig.from_preset(preset, **overrides)
    elif preset is not None or any(v is not None for v in overrides.values()):
        raise ValueError("pass either config= or preset/dimension arguments, not both")
    return write_tiny_llm(config, out_dir)


def timed_generate(config: TinyLlmConfig, out_dir: str | os.PathLike,
                   progress: Callable[[int, int], Any] | None = None) -> tuple[str, float]:
    """:func:`write_tiny_llm` plus its wall time in seconds (for the CLI's report)."""
    t0 = time.perf_counter()
    path = write_tiny_llm(config, out_dir, progress)
    return path, time.perf_counter() - t0
