"""``onnx-prepared cache build | verify | info`` (through ``add_cache_parser``)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from onnx_prepared.cache_cli import add_cache_parser
from onnx_prepared.prepared.cache import PreparedModelPolicy, PreparedModelStore, source_model_digest, verify
from onnx_prepared.resolve.keys import PreparedKey

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "genai_int4")
SRC = hashlib.sha256(b"source model").hexdigest()


def cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    add_cache_parser(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(["cache", *argv])
    return args.fn(args)


def small_cache(path) -> PreparedKey:
    k = PreparedKey(("W",), "gemm_b:t1", "cpu", hashlib.sha256(b"W").hexdigest())
    s = PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.BUILD_IF_MISSING)
    s.put(k, np.arange(5000, dtype=np.uint8))
    s.put(PreparedKey(("V",), "nbits", "cpu", hashlib.sha256(b"V").hexdigest()), np.ones(10, np.uint8))
    s.flush()
    s.close()
    return k


def test_verify_exit_codes(tmp_path, capsys):
    path = tmp_path / "m.prepared.onnx"
    k = small_cache(path)
    assert cli("verify", str(path)) == 0
    assert "OK" in capsys.readouterr().out
    e = PreparedModelStore(path, source_digest=SRC, policy=PreparedModelPolicy.READ_ONLY).lookup(k)
    with open(e.file, "r+b") as f:
        f.seek(e.offset + 10)
        f.write(bytes([(10 + 1) % 256]))  # payload byte 10 was 10
    assert cli("verify", str(path)) == 1
    out = capsys.readouterr().out
    assert "prepared/W@gemm_b:t1" in out and "checksum mismatch" in out
    path.write_bytes(b"\x00garbage")
    assert cli("verify", str(path)) == 1
    assert "not a valid ONNX protobuf" in capsys.readouterr().out


def test_verify_checks_the_source_model(tmp_path, capsys):
    path = tmp_path / "m.prepared.onnx"
    small_cache(path)
    from onnx import TensorProto, helper

    model = tmp_path / "other.onnx"
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model.write_bytes(helper.make_model(g).SerializeToString())
    assert cli("verify", str(path), "--model", str(model)) == 1
    assert "belongs to source model" in capsys.readouterr().out


def test_info_text_and_json(tmp_path, capsys):
    path = tmp_path / "m.prepared.onnx"
    small_cache(path)
    assert cli("info", str(path), "--entries") == 0
    out = capsys.readouterr().out
    assert "entries: 2   payload bytes: 5,010" in out and "gemm_b:t1 x1, nbits x1" in out
    assert "prepared/W@gemm_b:t1" in out and SRC in out
    assert cli("info", str(path), "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["entries"] == 2 and summary["total_bytes"] == 5010 and summary["source_model_digest"] == SRC


def test_build_persists_every_packed_object_and_is_idempotent(tmp_path, capsys):
    pytest.importorskip("onnx_prepared.runtime")
    folder = tmp_path / "model"
    shutil.copytree(FIXTURE, folder)
    model, out = folder / "model.onnx", tmp_path / "c" / "model.prepared.onnx"
    assert cli("build", str(model), "--out", str(out), "--quiet") == 0
    assert verify(out, source_digest=source_model_digest(model)) == []
    s = PreparedModelStore(out, source_digest=source_model_digest(model), policy=PreparedModelPolicy.READ_ONLY)
    n, gen = len(s.entries()), s.generation
    assert n > 0 and all(e.layout.startswith("matmul-nbits") for e in s.entries().values())
    assert "entries" in capsys.readouterr().out
    before = sorted(os.listdir(out.parent))
    assert cli("build", str(model), "--out", str(out), "--quiet") == 0  # every entry hits: nothing written
    s2 = PreparedModelStore(out, source_digest=source_model_digest(model), policy=PreparedModelPolicy.READ_ONLY)
    assert (len(s2.entries()), s2.generation) == (n, gen) and sorted(os.listdir(out.parent)) == before
