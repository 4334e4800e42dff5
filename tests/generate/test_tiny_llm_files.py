"""The generated files: determinism, aligned + checksummed external data, checker/loader acceptance, layout."""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import hashlib
import itertools
import json
import os
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnx_prepared.generate import (
    DATA_FILE,
    MODEL_FILE,
    PRESETS,
    TinyLlmConfig,
    add_generate_parser,
    check_model,
    decode_feeds,
    generate_tiny_llm,
    prefill_feeds,
    weight_names,
)
from onnx_prepared.generate.quantize import dequantize_int4, quantize_int4
from onnx_prepared.model import ExternalDataReader, load_model

FILES = (MODEL_FILE, DATA_FILE, "genai_config.json")


def test_same_arguments_give_byte_identical_files(tmp_path, small_config, small_model):
    again = generate_tiny_llm(tmp_path / "again", config=small_config)
    first_dir = os.path.dirname(small_model)
    for name in FILES:
        assert filecmp.cmp(os.path.join(first_dir, name), os.path.join(os.path.dirname(again), name), shallow=False)
    other = generate_tiny_llm(tmp_path / "seed1", config=dataclasses.replace(small_config, seed=1))
    assert not filecmp.cmp(os.path.join(first_dir, DATA_FILE), os.path.join(os.path.dirname(other), DATA_FILE),
                           shallow=False)
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "again"))


def test_every_initializer_is_external_aligned_and_checksummed(small_model):
    model = onnx.load(small_model, load_external_data=False)
    with open(os.path.join(os.path.dirname(small_model), DATA_FILE), "rb") as f:
        data = f.read()
    spans = []
    for t in model.graph.initializer:
        assert t.data_location == TensorProto.EXTERNAL, t.name
        info = {e.key: e.value for e in t.external_data}
        assert list(info) == ["location", "offset", "length", "checksum"]
        assert info["location"] == DATA_FILE
        off, length = int(info["offset"]), int(info["length"])
        assert off % 4096 == 0, t.name
        assert hashlib.sha256(data[off:off + length]).hexdigest() == info["checksum"], t.name
        spans.append((off, off + length))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no overlap
    assert spans[-1][1] == len(data)  # nothing after the last tensor


def test_checker_and_loader_accept_it(small_model):
    check_model(small_model)  # onnx.checker on the path, with ORT's default-domain SimplifiedLayerNormalization
    assert not onnx.defs.has("SimplifiedLayerNormalization")  # registry restored afterwards
    with pytest.raises(onnx.checker.ValidationError, match="SimplifiedLayerNormalization"):
        onnx.checker.check_model(small_model)  # plain checker: genai's default-domain contrib op is its only issue
    m = load_model(small_model)
    assert len(m.weights) == len(m.graph.initializer)
    with ExternalDataReader() as reader:
        for w in m.weights.values():
            assert w.is_external and w.payload.checksum
            assert hashlib.sha256(reader.read_bytes(w).tobytes()).hexdigest() == w.payload.checksum


def test_graph_layout_is_genai_shaped(small_model, small_config):
    c = small_config
    model = onnx.load(small_model, load_external_data=False)
    g = model.graph
    kv = ["batch_size", c.kv_heads, "past_sequence_length", c.head_dim]
    expect_in = {"input_ids": (TensorProto.INT64, ["batch_size", "sequence_length"]),
                 "attention_mask": (TensorProto.INT64, ["batch_size", "total_sequence_length"])}
    expect_out = {"logits": (TensorProto.FLOAT, ["batch_size", "sequence_length", c.vocab])}
    for i in range(c.layers):
        for kind in ("key", "value"):
            expect_in[f"past_key_values.{i}.{kind}"] = (TensorProto.FLOAT, kv)
            expect_out[f"present.{i}.{kind}"] = (TensorProto.FLOAT, [*kv[:2], "total_sequence_length", c.head_dim])
    assert _io(g.input) == expect_in
    assert _io(g.output) == expect_out
    assert list(expect_in) == [i.name for i in g.input] and list(expect_out) == [o.name for o in g.output]

    ops = Counter((n.domain, n.op_type) for n in g.node)
    ms = "com.microsoft"
    assert ops[(ms, "MatMulNBits")] == 4 * c.layers + 1
    assert ops[(ms, "GroupQueryAttention")] == c.layers
    assert ops[(ms, "SkipSimplifiedLayerNormalization")] == 2 * c.layers
    assert ops[("", "SimplifiedLayerNormalization")] == 1
    assert ops[(ms, "GatherBlockQuantized")] == 1
    assert ops[("", "Sigmoid")] == c.layers and ops[("", "Slice")] == 2 * c.layers
    assert {o for _, o in ops} <= {"MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization",
                                   "SimplifiedLayerNormalization", "GatherBlockQuantized", "Constant", "ReduceSum",
                                   "Sub", "Cast", "Shape", "Gather", "Reshape", "Slice", "Sigmoid", "Mul"}
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, ms: 1}

    nodes = {n.name: n for n in g.node}
    gqa = nodes["/model/layers.0/attn/GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["do_rotary"] == 1 and attrs["num_heads"] == c.heads and attrs["kv_num_heads"] == c.kv_heads
    assert list(gqa.input[:7]) == ["/model/layers.0/attn/qkv_proj/MatMulNBits/output_0", "", "",
                                   "past_key_values.0.key", "past_key_values.0.value",
                                   "/model/attn_mask_reformat/attn_mask_subgraph/Sub/Cast/output_0",
                                   "/model/attn_mask_reformat/attn_mask_subgraph/Gather/Cast/output_0"]
    assert list(gqa.input[7:]) == ["cos_cache", "sin_cache"]
    # Tied embedding: GatherBlockQuantized reads the LM head's INT4 initializer (through a Reshape) and scales.
    lm_w, lm_s = weight_names(c, "emb")
    assert nodes["/lm_head/MatMulNBits"].input[1:] == [lm_w, lm_s]
    assert nodes["/model/embed_tokens/Reshape"].input[0] == lm_w
    assert nodes["/model/embed_tokens/GatherBlockQuantized"].input[2] == lm_s


def _io(values) -> dict:
    out = {}
    for v in values:
        t = v.type.tensor_type
        out[v.name] = (t.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim])
    return out


def test_spec_logical_names_are_discoverable(small_model, small_config):
    model = onnx.load(small_model, load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    logical = json.loads(props["onnx_prepared.logical_names"])
    for i in range(small_config.layers):
        for proj in ("qkv", "attn_out", "gate_up", "down"):
            assert logical[f"layer{i}.{proj}"] == list(weight_names(small_config, f"layer{i}.{proj}"))
    assert logical["emb"] == list(weight_names(small_config, "emb"))
    assert TinyLlmConfig.from_model(small_model) == small_config
    qkv = next(n for n in model.graph.node if n.name == "/model/layers.1/attn/qkv_proj/MatMulNBits")
    assert {p.key: p.value for p in qkv.metadata_props} == {"onnx_prepared.logical_name": "layer1.qkv"}
    t = next(t for t in model.graph.initializer if t.name == weight_names(small_config, "layer0.down")[0])
    assert {p.key: p.value for p in t.metadata_props} == {"onnx_prepared.logical_name": "layer0.down",
                                                          "onnx_prepared.logical_part": "int4"}


def test_weights_are_sane(small_model, small_config):
    c = small_config
    m = load_model(small_model)
    with ExternalDataReader() as reader:
        w, s = (reader.read(m.weights[n]) for n in weight_names(c, "layer0.gate_up"))
        cos = reader.read(m.weights["cos_cache"])
    assert w.shape == (2 * c.intermediate, c.hidden // 32, 16) and w.dtype == np.uint8
    assert s.shape == (2 * c.intermediate, c.hidden // 32) and s.dtype == np.float32
    dense = dequantize_int4(w, s)
    assert abs(dense.std() - c.init_std) < 0.1 * c.init_std
    assert cos.shape == (c.context_length, c.head_dim // 2)
    np.testing.assert_allclose(cos[:, 0], np.cos(np.arange(c.context_length)), atol=1e-5)


def test_quantize_layout_and_roundtrip():
    w = np.zeros((1, 32), np.float32)
    w[0, 0], w[0, 1], w[0, 31] = 7.0, -7.0, 1.0
    packed, scales = quantize_int4(w, 32)
    assert packed.shape == (1, 1, 16) and scales.tolist() == [[1.0]]
    assert packed[0, 0, 0] == 15 | (1 << 4)  # k=0 -> low nibble (7 + 8), k=1 -> high nibble (-7 + 8)
    assert packed[0, 0, 15] == 8 | (9 << 4)  # k=30 -> 0 + 8, k=31 -> 1 + 8
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    packed, scales = quantize_int4(w, 32)
    err = np.abs(dequantize_int4(packed, scales) - w).reshape(8, 2, 32)
    assert (err <= scales[..., None] / 2 + 1e-6).all()


def test_config_validation_and_presets():
    with pytest.raises(ValueError, match="not divisible by heads"):
        TinyLlmConfig(hidden=100, heads=8)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        TinyLlmConfig(heads=8, kv_heads=3)
    with pytest.raises(ValueError, match="multiple of block_size"):
        TinyLlmConfig(intermediate=2050)
    with pytest.raises(ValueError, match="unknown tiny-llm preset"):
        TinyLlmConfig.from_preset("huge")
    tiny = PRESETS["tiny"]
    assert (tiny.layers, tiny.hidden, tiny.intermediate, tiny.vocab, tiny.heads, tiny.head_dim) == (4, 512, 2048,
                                                                                                    8192, 8, 64)
    assert tiny.kv_cache_bytes(128, itemsize=2) == 1 << 20  # the spec's 1.00 MiB KV-cache arithmetic
    medium = PRESETS["medium"]
    # 16 x (qkv 1024x1536 + o 1024x1024 + gate_up 1024x5632 + down 2816x1024) + emb 32000x1024 + 33 norms x 1024
    assert medium.num_parameters == 16 * 11_272_192 + 32_768_000 + 33 * 1024 == 213_156_864
    assert TinyLlmConfig.from_preset("medium", layers=2).layers == 2


def test_cli_subcommand_writes_the_model(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="onnx-prepared")
    add_generate_parser(parser.add_subparsers(dest="cmd", required=True))
    out = tmp_path / "cli"
    args = parser.parse_args(["generate", "tiny-llm", str(out), "--layers", "1", "--hidden", "64",
                              "--intermediate", "64", "--heads", "2", "--kv-heads", "1", "--vocab", "128",
                              "--context-length", "32", "--seed", "7"])
    assert args.fn(args) == 0
    assert sorted(os.listdir(out)) == sorted(FILES)
    assert TinyLlmConfig.from_model(out / MODEL_FILE) == TinyLlmConfig(
        layers=1, hidden=64, intermediate=64, heads=2, kv_heads=1, vocab=128, context_length=32, seed=7)
    assert "parameters:" in capsys.readouterr().out
    bad = parser.parse_args(["generate", "tiny-llm", str(out), "--heads", "7"])
    assert bad.fn(bad) == 2


def test_feeds_shapes(small_config):
    c = small_config
    f = prefill_feeds(c, [3, 4, 5])
    assert f["input_ids"].tolist() == [[3, 4, 5]] and f["attention_mask"].shape == (1, 3)
    assert f["past_key_values.1.value"].shape == (1, c.kv_heads, 0, c.head_dim)
    present = {f"present.{i}.{k}": np.zeros((1, c.kv_heads, 3, c.head_dim), np.float32)
               for i in range(c.layers) for k in ("key", "value")}
    d = decode_feeds(c, 9, {"logits": None, **present})
    assert d["input_ids"].tolist() == [[9]] and d["attention_mask"].shape == (1, 4)
    assert d["past_key_values.0.key"] is present["present.0.key"]
    with pytest.raises(ValueError, match=r"present\.0\.key"):
        decode_feeds(c, 9, {})
