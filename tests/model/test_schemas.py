"""model/schemas.py: the schema facts validation reads, cached per onnx build, equal to the registry's."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

from onnx_prepared import onnx_proto
from onnx_prepared.errors import ModelLoadError
from onnx_prepared.model import schemas
from onnx_prepared.model.loader import load_model_bytes
from tests.helpers.models import relu_add

_OPS = [("", "Gemm", 17), ("", "Concat", 13), ("", "Loop", 16), ("", "Shape", 15), ("", "Constant", 21),
        ("", "Cast", 19), ("", "Slice", 13), ("ai.onnx.ml", "TreeEnsembleClassifier", 3), ("", "Max", 13)]


def _facts(s: schemas.Schema) -> list:
    return s.to_json()


@pytest.mark.parametrize(("domain", "op", "version"), _OPS)
def test_cached_facts_equal_the_registry(tmp_path, domain, op, version):
    build = onnx_proto.schema_build()
    want = schemas.Schema.from_registry(onnx.defs.get_schema(op, version, domain))
    first = schemas.SchemaCache(str(tmp_path), build)
    assert _facts(first.lookup(op, version, domain)) == _facts(want)
    first.flush()
    again = schemas.SchemaCache(str(tmp_path), build)  # from the file only
    assert again._ops and _facts(again.lookup(op, version, domain)) == _facts(want)
    assert again.max_opset("") == onnx.defs.onnx_opset_version()


def test_unknown_op_and_missing_opset(tmp_path):
    c = schemas.SchemaCache(str(tmp_path), onnx_proto.schema_build())
    assert c.lookup("NoSuchOp", 17, "") is None
    with pytest.raises(schemas.NotInOpset):
        c.lookup("Gelu", 17, "")  # Gelu first appears in opset 20


def test_corrupt_or_foreign_file_is_ignored(tmp_path):
    build = onnx_proto.schema_build()
    c = schemas.SchemaCache(str(tmp_path), build)
    c.lookup("Relu", 17, "")
    c.flush()
    (path,) = tmp_path.iterdir()
    good = path.read_bytes()
    for bad in (b"{not marshal", good[: len(good) // 2], marshal.dumps([1, 2]),
                marshal.dumps({"build": "another", "opsets": {}, "ops": {"|Relu|17": None}}),
                marshal.dumps({"build": build, "opsets": {}, "ops": {"|Relu|17": [1, 2]}})):  # malformed entry
        path.write_bytes(bad)
        assert schemas.SchemaCache(str(tmp_path), build).lookup("Relu", 17, "").since_version == 14


def test_first_lookup_loads_neither_json_nor_openssl(tmp_path):
    """The cache file is read and written without ``json`` or ``hashlib`` (the first session of a
    process reads it; either module costs 1.4-2.8 ms to load)."""
    code = ("import sys\nfrom onnx_prepared.model import schemas\nfrom onnx_prepared import onnx_proto\n"
            f"c = schemas.SchemaCache({str(tmp_path)!r}, onnx_proto.schema_build())\n"
            "c.lookup('Relu', 17, ''); c.flush()\n"
            "print(sorted({'json', 'hashlib'} & set(sys.modules)))")
    for _ in range(2):  # writes the file, then reads it
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "[]"
    assert len(list(tmp_path.iterdir())) == 1


def test_validation_still_refuses_with_a_warm_cache(tmp_path):
    """The facts refuse what the registry refused: an undeclared attribute and a bad input count."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    for node, msg in ((helper.make_node("Relu", ["x"], ["y"], alpha=1.0), "does not declare"),
                      (helper.make_node("Relu", ["x", "x"], ["y"]), "inputs")):
        m = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
        for _ in range(2):  # the second load answers from the cache
            with pytest.raises(ModelLoadError, match=msg):
                load_model_bytes(m.SerializeToString(), tmp_path)


def test_second_process_loads_no_schema_registry(tmp_path):
    """With the facts cached by a first process, parsing and validating a model in a fresh interpreter
    never loads onnx's C++ extension (structure, not timing)."""
    path = relu_add(tmp_path)
    code = ("import sys, json\nfrom onnx_prepared.model import load_model\n"
            f"load_model({str(path)!r})\nprint(json.dumps(sorted(sys.modules)))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    runs = [set(json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                          check=True).stdout.strip().splitlines()[-1])) for _ in range(2)]
    assert "onnx.onnx_cpp2py_export" in runs[0]  # the first process asked the registry ...
    assert "onnx.onnx_cpp2py_export" not in runs[1]  # ... the second read its answers
    assert not {m for m in runs[1] if m == "onnx" or m.startswith("onnx.")} - {"onnx.onnx_ml_pb2"}
