"""``import onnx_prepared`` loads only what building a session needs (structure, not timing).

Kernel modules load when a model uses their ops (kernels/catalog.py), ``onnx.reference`` when a node
needs the fallback, the ``onnx`` package itself (helper, compose, ...) not at all on a plain model
(onnx_prepared/onnx_proto.py loads onnx's protobuf classes and schemas directly), and the CLI's
``--help`` builds no runtime.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import numpy as np
from onnx import TensorProto, helper

from onnx_prepared.kernels.catalog import MODULES
from tests.helpers.models import relu_add

_KERNEL_MODULES = {f"onnx_prepared.kernels.{m}" for m in MODULES}


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(sorted(sys.modules))"],  # (no json)
                         capture_output=True, text=True, check=True).stdout
    return set(ast.literal_eval(out.strip().splitlines()[-1]))


def _heavy(mods: set[str]) -> set[str]:
    """Kernel modules and the onnx.reference fallback that were loaded."""
    return {m for m in mods if m in _KERNEL_MODULES or m.startswith(("onnx.reference", "onnx_prepared.bind.reference"))}


def test_import_loads_no_kernel_and_no_reference():
    assert _heavy(_modules_after("from onnx_prepared import InferenceSession, RuntimeSession")) == set()


def test_import_skips_protobufs_python_layer_and_the_schema_registry():
    """onnx's messages are built on upb directly (no descriptor_pool, whose import pulls in protobuf's
    pure-Python message implementation), and onnx's C++ extension (the schema registry) loads only when
    validation first asks it."""
    mods = _modules_after("import numpy\nfrom onnx_prepared import RuntimeSession, onnx_proto\n"
                          "assert onnx_proto.ModelProto.FromString(onnx_proto.ModelProto(ir_version=8)"
                          ".SerializeToString()).ir_version == 8")
    assert "onnx.onnx_ml_pb2" in mods
    assert not mods & {"google.protobuf.descriptor_pool", "google.protobuf.internal.python_message",
                       "google.protobuf.text_format", "onnx.onnx_cpp2py_export"}


def test_bare_import_builds_no_runtime():
    """The sessions load on first access, so `import onnx_prepared` (every CLI start) stays small."""
    mods = _modules_after("import onnx_prepared")
    assert {m for m in mods if m.startswith("onnx_prepared")} == {"onnx_prepared", "onnx_prepared.errors",
                                                                  "onnx_prepared.options"}


def test_import_leaves_logging_futures_and_hashing_for_later():
    """``logging`` (pulled by ``concurrent.futures._base``, the base of ``CancelledError`` and of a handle's
    future), OpenSSL's ``hashlib``, ``json`` and ``dataclasses`` load when a cancellation, a log message, a
    checksum, a cache file or dataclass introspection first needs them, not with the import a user's
    first line makes (records.record builds the classes without dataclasses)."""
    mods = _modules_after("import numpy\nfrom onnx_prepared import InferenceSession, RuntimeSession")
    assert not mods & {"logging", "concurrent.futures", "concurrent.futures._base", "hashlib", "json", "dataclasses"}
    mods = _modules_after("from onnx_prepared import CancelledError\nimport concurrent.futures, asyncio\n"
                          "from onnx_prepared import errors, scheduler\n"
                          "assert CancelledError is errors.CancelledError is scheduler.CancelledError\n"
                          "assert issubclass(CancelledError, (concurrent.futures.CancelledError, errors.Cancelled))\n"
                          "try:\n    raise CancelledError('x')\nexcept concurrent.futures.CancelledError as e:\n"
                          "    assert isinstance(e, errors.Cancelled) and not isinstance(e, asyncio.CancelledError)")
    assert "concurrent.futures" in mods


def test_session_loads_only_its_kernels(tmp_path):
    path = relu_add(tmp_path)
    mods = _modules_after(
        "import numpy as np, onnx_prepared as op\n"
        f"s = op.InferenceSession({str(path)!r})\n"
        "print(s.run(None, {'x': np.ones((2, 3), np.float32)})[0].sum())")
    assert _heavy(mods) == {"onnx_prepared.kernels.activation", "onnx_prepared.kernels.elementwise"}


def test_fallback_loads_reference_on_first_need():
    from onnx_prepared import InferenceSession

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    g = helper.make_graph([helper.make_node("Acosh", ["x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = InferenceSession(m.SerializeToString())
    v = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": v})[0], np.arccosh(v), rtol=1e-6)
    assert "onnx.reference" in sys.modules


def test_cli_help_builds_no_runtime():
    mods = _modules_after("import sys; sys.argv = ['onnx-prepared', '--help']\nfrom onnx_prepared import cli\n"
                          "try:\n    cli.main()\nexcept SystemExit:\n    pass")
    assert not {m for m in mods if m == "onnx" or m.startswith(("onnx.", "onnx_prepared.runtime",
                                                                 "onnx_prepared.scheduler", "onnx_prepared.kernels"))}


def test_plain_session_does_not_import_the_onnx_package(tmp_path):
    """Parsing, planning and running a plain model need onnx's protobuf classes and schemas only."""
    path = relu_add(tmp_path)
    mods = _modules_after(
        "import numpy as np, onnx_prepared as op\n"
        f"s = op.InferenceSession({str(path)!r})\n"
        "assert s.run(None, {'x': np.ones((2, 3), np.float32)})[0].sum() == 12")
    assert "onnx.onnx_ml_pb2" in mods
    assert not {m for m in mods if m in ("onnx", "onnx.helper", "onnx.compose", "onnx.numpy_helper")
                or m.startswith("onnx.reference")}


def test_onnx_imported_later_shares_the_classes():
    """A model built with the real onnx after our import is the same ModelProto class, and onnx works."""
    code = """
import numpy as np
from onnx_prepared import InferenceSession, onnx_proto
import onnx
from onnx import TensorProto, helper
assert onnx.ModelProto is onnx_proto.ModelProto and onnx.TensorProto is onnx_proto.TensorProto
assert onnx.defs.get_schema("Relu", 17).since_version == 14
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                      opset_imports=[helper.make_opsetid("", 17)])
onnx.checker.check_model(m)
print(InferenceSession(m).run(None, {"x": np.array([-1.0, 0.0, 2.0], np.float32)})[0].tolist())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[0.0, 0.0, 2.0]"


def test_int4_llm_session_does_not_import_the_onnx_package(tmp_path):
    """The tiny INT4 LLM (MatMulNBits, GQA, Constant attributes, int64 initializers) parses, plans and runs
    a prefill without running onnx/__init__."""
    from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm, prefill_feeds

    cfg = dict(layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=128)
    path = generate_tiny_llm(tmp_path / "llm", **cfg)
    np.savez(tmp_path / "feeds.npz", **prefill_feeds(TinyLlmConfig(**cfg), list(range(3, 11))))
    mods = _modules_after(
        "import numpy as np\nfrom onnx_prepared import RuntimeSession\n"
        f"feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))\n"
        f"s = RuntimeSession({str(path)!r}, {{'prepared_model_policy': 'disabled'}})\n"
        "assert np.isfinite(np.asarray(s.run(feeds)[0])).all()")
    assert not {m for m in mods if m in ("onnx", "onnx.helper", "onnx.compose", "onnx.numpy_helper")
                or m.startswith("onnx.reference")}


def test_first_llm_session_loads_no_json_hashlib_or_dataclasses(tmp_path):
    """A process's first session of an INT4 LLM (MatMulNBits, GatherBlockQuantized, no companion) loads none
    of ``json``, OpenSSL's ``hashlib`` and ``dataclasses`` (1.4, 2.2-2.8 and ~4 ms to load) while it is
    built: the schema cache is marshal data named by a CRC, and the packed-weight classes are records. (The
    first run's reads of checksummed weights load hashlib and json for the verification records.) Twice:
    the first process writes the schema cache file, the second reads it."""
    from onnx_prepared.generate import generate_tiny_llm

    path = generate_tiny_llm(tmp_path / "m", layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1,
                             vocab=256, block_size=32, context_length=32)
    code = ("import numpy as np\nfrom onnx_prepared import RuntimeSession\n"
            f"s = RuntimeSession({str(path)!r}, {{'prepared_model_policy': 'disabled'}})")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(sorted(sys.modules))\ns.close()"],
                             capture_output=True, text=True, check=True, env=env).stdout
        mods = set(ast.literal_eval(out.strip().splitlines()[-1]))
        assert "onnx_prepared.kernels.matmul_nbits" in mods
        assert not mods & {"json", "hashlib", "_hashlib", "dataclasses"}
    assert len(list((tmp_path / "cache" / "onnx-prepared" / "schemas").iterdir())) == 1
