"""onnx's backend node cases re-targeted to every older opset where the op's schema still applies.

The generators write each case at one opset (mostly the newest), so an op's older versions are never
run: BatchNormalization-9, for one, had wrong values that opset-15 cases could not show. For each
single-node case of the default domain we take every earlier schema version S of its op (S >= 7, the
oldest opset onnxruntime runs), set the model's opset to S, and keep the variant when onnx's full
checker (strict shape and type inference) accepts it. Older versions may mean something else
(Hardmax-11 flattens to 2-D, Hardmax-13 does not), so the oracle is onnxruntime running the variant,
not the case's stored outputs. Random-output ops are left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx.defs

from tests.conformance.node_cases import _assert_similar, feeds_of, load_cases

KNOWN_FAILURES_FILE = __file__.replace("opset_cases.py", "known_failures_opsets.txt")
OLDEST = 7
#: ops whose values are random draws: never comparable between runtimes
RANDOM_OPS = frozenset({"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Multinomial"})


@dataclass(frozen=True)
class OpsetCase:
    name: str  # "<node case>@<opset>"
    case: Any  # the onnx TestCase whose inputs it runs
    model: onnx.ModelProto


def _since_versions(op: str, below: int) -> list[int]:
    out, v = [], below - 1
    while v >= OLDEST:
        try:
            s = onnx.defs.get_schema(op, v, "")
        except onnx.defs.SchemaError:
            break
        if s.since_version < OLDEST:
            break
        out.append(s.since_version)
        v = s.since_version - 1
    return out


@functools.lru_cache(maxsize=1)
def load_opset_cases() -> tuple[OpsetCase, ...]:
    out = []
    for case in load_cases():
        m = case.model
        if len(m.graph.node) != 1 or "expanded" in case.name:
            continue
        node = m.graph.node[0]
        if node.domain not in ("", "ai.onnx") or node.op_type in RANDOM_OPS:
            continue
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            continue  # training-mode Dropout: a random mask
        opset = {o.domain or "ai.onnx": o.version for o in m.opset_import}.get("ai.onnx")
        if opset is None:
            continue
        current = onnx.defs.get_schema(node.op_type, opset, "").since_version
        for s in _since_versions(node.op_type, current):
            variant = onnx.ModelProto()
            variant.CopyFrom(m)
            for o in variant.opset_import:
                if o.domain in ("", "ai.onnx"):
                    o.version = s
            try:
                onnx.checker.check_model(variant, full_check=True)
            except Exception:  # the node's attributes, inputs or types do not exist at opset s
                continue
            out.append(OpsetCase(f"{case.name}@{s}", case, variant))
    return tuple(out)


def known_failures(path: str = KNOWN_FAILURES_FILE) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition("#")
                out[name.strip()] = reason.strip() or "known failure"
    return out


class OnnxruntimeUnavailable(Exception):
    """onnxruntime cannot load or run the variant (no kernel for that opset or type): nothing to compare."""


def reference_outputs(oc: OpsetCase) -> list[list]:
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.log_severity_level = 4
    try:
        sess = onnxruntime.InferenceSession(oc.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return [sess.run(None, feeds_of(oc.model, inputs)) for inputs, _ in oc.case.data_sets]
    except Exception as e:
        raise OnnxruntimeUnavailable(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None


def assert_matches_reference(oc: OpsetCase, got: list[list], expected: list[list]) -> None:
    """Per data set: same count, shapes, dtypes; values within the case's tolerance or atol 1e-4 + rtol 1e-3,
    whichever is looser (the oracle is another runtime, not exact arithmetic). onnxruntime returns float8
    and 4-bit tensors as their raw uint8/int8 storage: ours are compared in that storage."""
    rtol, atol = max(oc.case.rtol, 1e-3), max(oc.case.atol, 1e-4)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert len(g) == len(e), f"data set {k}: {len(g)} outputs, onnxruntime gives {len(e)}"
        for i, (ours, ref) in enumerate(zip(g, e)):
            if isinstance(ours, np.ndarray) and isinstance(ref, np.ndarray) and ours.dtype != ref.dtype \
                    and ours.dtype.isbuiltin != 1 and ours.dtype.itemsize == ref.dtype.itemsize:
                ours = ours.view(ref.dtype)
            _assert_similar(ref, ours, rtol, atol, f"data set {k} output {i}")
