"""Mutations and the oracle of the fuzz campaign (tests/reliability/test_fuzz.py, tools/fuzz_campaign.py).

The only allowed outcomes of a mutated case are a correct result (onnxruntime's, when it accepts the
mutated model, else the unmutated model's) or an ``OnnxPreparedError``, within ``bounded``'s time
limit. Anything else (a foreign exception, a wrong result, a hang) is a finding.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import numpy_helper

from onnx_prepared.errors import OnnxPreparedError
from tests.helpers.models import add_checksums, gemm_mlp
from tests.reliability.bounded import bounded

X = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
CASE_SECONDS = 20.0
_NO_OUTPUT = np.zeros((0, 0, 0), np.float32)  # what a graph without outputs returns, for both runtimes


@dataclass
class Outcomes:
    """Counts per outcome class; ``findings`` holds the description of every disallowed outcome."""

    counts: Counter = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)


def make_base(folder: str) -> str:
    """A 2-layer Gemm MLP with external, checksummed weights (the unmutated model)."""
    os.makedirs(folder, exist_ok=True)
    path = gemm_mlp(folder, layers=2, width=8)
    add_checksums(path)
    return path


def ours(path: str, opts: dict | None = None):
    from onnx_prepared import RuntimeSession

    with RuntimeSession(path, opts or {}) as s:
        outs = s.run({"x": X})
        return np.asarray(outs[0]) if outs else _NO_OUTPUT  # a mutation may remove every graph output


def ort(path: str):
    try:
        import onnxruntime as rt

        sess = rt.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs = sess.run(None, {"x": X})
        return np.asarray(outs[0]) if outs else _NO_OUTPUT
    except Exception:  # onnxruntime refuses the mutated model: the oracle falls back to the unmutated one
        return None


def judge(run, reference, expected_ort, outcomes: Outcomes, what: str) -> None:
    """Run ``run`` bounded; classify the outcome against the allowed ones."""
    value, err = bounded(run, CASE_SECONDS)
    if err is not None:
        if isinstance(err, OnnxPreparedError):
            outcomes.counts[f"error:{type(err).__name__}"] += 1
            return
        outcomes.counts["foreign_exception"] += 1
        outcomes.findings.append(f"{what}: foreign {type(err).__name__}: {str(err)[:300]}")
        return
    want = expected_ort if expected_ort is not None else reference
    if want is not None and value.shape == want.shape and np.allclose(value, want, rtol=1e-3, atol=1e-4,
                                                                      equal_nan=True):
        outcomes.counts["correct"] += 1
        return
    outcomes.counts["wrong_result"] += 1
    outcomes.findings.append(f"{what}: result {np.ravel(value)[:4]} differs from {np.ravel(want)[:4]}")


# ---- model mutations ------------------------------------------------------------------------------

_DIGITS = st.one_of(st.integers(-5, 10**6).map(str), st.text("0123456789", min_size=15, max_size=5000),
                    st.sampled_from(["", " 1", "1_0", "+3", "0x10", "-1", "nan"]))
_LOCATIONS = st.sampled_from(["", "../x.data", "/etc/passwd", "a\0b", "missing.data", "model.onnx", ".",
                              "C:\\x", "model.data"])
_DIMS = st.lists(st.one_of(st.integers(-3, 40), st.just(2**62), st.just(10**12)), max_size=4)


def model_mutation():
    """A (description, function(ModelProto) -> None) pair."""
    return st.one_of(
        st.tuples(st.just("ir_version"), st.integers(-2, 200)),
        st.tuples(st.just("opset"), st.integers(-2, 200)),
        st.tuples(st.just("op_type"), st.sampled_from(["Gemm", "Relu", "Foo", "", "If", "Loop", "MatMul", "Add"])),
        st.tuples(st.just("drop_input"), st.integers(0, 2)),
        # values of the schema's type and of the wrong one (INT alpha, FLOAT transB: refused at load)
        st.one_of(st.tuples(st.just("attr"), st.sampled_from(["transB", "bogus", "alpha"]), st.integers(0, 1)),
                  st.tuples(st.just("attr"), st.sampled_from(["alpha", "beta", "transB"]),
                            st.floats(-3, 3, allow_nan=False))),
        st.tuples(st.just("dims"), st.integers(0, 3), _DIMS),
        st.tuples(st.just("data_type"), st.integers(0, 3), st.integers(-1, 40)),
        st.tuples(st.just("ext"), st.integers(0, 3), st.sampled_from(["offset", "length", "checksum"]), _DIGITS),
        st.tuples(st.just("location"), st.integers(0, 3), _LOCATIONS),
        st.tuples(st.just("node_name"), st.integers(1, 10**6)),
        # "W0": an initializer as the only graph output (every node dead), "x": the input as the output
        st.tuples(st.just("output_name"), st.sampled_from(["", "x", "nope", "W0"])),
    )


def apply_model_mutation(m: onnx.ModelProto, mut) -> None:
    kind, *a = mut
    g = m.graph
    inits = list(g.initializer)
    if kind == "ir_version":
        m.ir_version = a[0] & 0x7FFFFFFFFFFFFFFF if a[0] >= 0 else 0
    elif kind == "opset":
        m.opset_import[0].version = a[0]
    elif kind == "op_type":
        g.node[0].op_type = a[0]
    elif kind == "drop_input":
        n = g.node[0]
        if a[0] < len(n.input):
            del n.input[a[0]]
    elif kind == "attr":
        n = g.node[0]
        for at in list(n.attribute):
            if at.name == a[0]:
                n.attribute.remove(at)
        n.attribute.append(onnx.helper.make_attribute(a[0], a[1]))
    elif kind == "dims":
        t = inits[a[0] % len(inits)]
        del t.dims[:]
        t.dims.extend(a[1])
    elif kind == "data_type":
        inits[a[0] % len(inits)].data_type = max(a[1], 0)
    elif kind in ("ext", "location"):
        t = inits[a[0] % len(inits)]
        key, value = ("location", a[1]) if kind == "location" else (a[1], a[2])
        for e in t.external_data:
            if e.key == key:
                e.value = value
                break
        else:
            t.external_data.add(key=key, value=value)
    elif kind == "node_name":
        g.node[0].name = "n" * a[0]
    elif kind == "output_name":
        g.output[0].name = a[0]


def bytes_mutation():
    return st.one_of(st.tuples(st.just("truncate"), st.floats(0, 1)),
                     st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)))


def apply_bytes_mutation(data: bytes, mut) -> bytes:
    kind, where, *rest = mut
    i = int(where * max(len(data) - 1, 0))
    if kind == "truncate":
        return data[:i]
    b = bytearray(data)
    if b:
        b[i] ^= rest[0]
    return bytes(b)


def run_model_case(base: str, work: str, mut, outcomes: Outcomes, *, as_bytes: bool = False) -> None:
    """Copy the base folder to ``work``, mutate its model, judge our run against the oracle."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.dirname(base), work)
    path = os.path.join(work, os.path.basename(base))
    reference = ours(base)
    if as_bytes:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(apply_bytes_mutation(data, mut))
    else:
        m = onnx.load(path, load_external_data=False)
        apply_model_mutation(m, mut)
        with open(path, "wb") as f:
            f.write(m.SerializeToString())
    judge(lambda: ours(path), reference, ort(path), outcomes, f"model {mut!r:.200}")


# ---- companion mutations --------------------------------------------------------------------------


def build_companion(base: str) -> str:
    companion = os.path.join(os.path.dirname(base), "c", "m.prepared.onnx")
    from onnx_prepared import RuntimeSession

    with RuntimeSession(base, {"prepared_model_policy": "build_if_missing",
                               "prepared_model_path": companion}) as s:
        s.run({"x": X})
        s.prepare()
    return companion


def companion_mutation():
    return st.tuples(st.sampled_from(["manifest", "payload"]), bytes_mutation())


def run_companion_case(base: str, companion: str, work: str, mut, outcomes: Outcomes,
                       policy: str = "read_only") -> None:
    """Copy the companion folder to ``work`` (the model stays in place, so its digests stay trusted and
    entries hit), mutate the manifest or a payload file, run under ``policy``."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.dirname(companion), work)
    copy = os.path.join(work, os.path.basename(companion))
    target, bmut = mut
    if target == "manifest":
        victim = copy
    else:
        victim = os.path.join(work, sorted(f for f in os.listdir(work) if f.endswith(".data"))[0])
    with open(victim, "rb") as f:
        data = f.read()
    with open(victim, "wb") as f:
        f.write(apply_bytes_mutation(data, bmut))
    judge(lambda: ours(base, {"prepared_model_policy": policy, "prepared_model_path": copy}),
          ours(base), None, outcomes, f"companion {mut!r:.200}")


# ---- exported models ------------------------------------------------------------------------------


def exported_mutation():
    """One to four byte mutations (flip or truncate), applied in turn."""
    return st.lists(bytes_mutation(), min_size=1, max_size=4)


@functools.lru_cache(maxsize=32)
def _base_scale(path: str) -> float:
    """:func:`_float_scale` of an unmutated model, read once per campaign."""
    return _float_scale(path)


def _float_scale(path: str) -> float:
    """The largest |value| of the model's float initializers (inf if one is not finite); 0 if unreadable."""
    try:
        m = onnx.load(path)
        arrays = [numpy_helper.to_array(t) for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    except Exception:
        return 0.0
    return max((float(np.max(np.abs(a))) if np.isfinite(a).all() else float("inf") for a in arrays if a.size),
               default=0.0)


def _same(got, want) -> bool:
    return len(got) == len(want) and all(
        np.asarray(a).shape == np.asarray(b).shape and np.asarray(a).dtype == np.asarray(b).dtype
        and (np.allclose(a, b, rtol=1e-3, atol=1e-4, equal_nan=True) if np.asarray(b).dtype.kind in "fc"
             else np.array_equal(a, b)) for a, b in zip(got, want))


def run_exported_case(path: str, feeds: dict, work: str, muts, outcomes: Outcomes) -> None:
    """Mutate the bytes of an exported model (tests/helpers/corpus.py: torch.onnx.export, onnxruntime's
    quantizers) and judge our run against onnxruntime's on the mutated file itself.

    Allowed: an onnx_prepared error, or onnxruntime's result (atol 1e-4 + rtol 1e-3, exact for integers),
    within the time bound. A result where onnxruntime refuses the file is counted as ``ort_refused`` and
    not judged: there is no oracle, and the cases differ (a QDQ CNN's renamed bias-scale initializer ran,
    with the unmutated result, until the resolver checked node inputs; a Conv's mutated pads give a true
    result onnxruntime refuses only because the exporter's value_info shapes no longer agree). A
    mutation that makes a float weight more than 100 times the largest one (a flipped exponent bit gives
    up to 1e38) leaves both results summation-order noise: ``ill_conditioned``, not judged."""
    from onnx_prepared import RuntimeSession

    def ours(p: str):
        with RuntimeSession(p) as s:
            return s.run(feeds)

    def onnxruntime(p: str):
        import onnxruntime as rt

        so = rt.SessionOptions()
        so.log_severity_level = 4
        return rt.InferenceSession(p, so, providers=["CPUExecutionProvider"]).run(None, feeds)

    os.makedirs(work, exist_ok=True)
    victim = os.path.join(work, os.path.basename(path))
    with open(path, "rb") as f:
        data = f.read()
    for mut in muts:
        data = apply_bytes_mutation(data, mut)
    with open(victim, "wb") as f:
        f.write(data)
    what = f"{os.path.basename(path)} {muts!r:.200}"
    value, err = bounded(lambda: ours(victim), CASE_SECONDS)
    if err is not None:
        if isinstance(err, OnnxPreparedError):
            outcomes.counts[f"error:{type(err).__name__}"] += 1
        else:
            outcomes.counts["foreign_exception"] += 1
            outcomes.findings.append(f"{what}: foreign {type(err).__name__}: {str(err)[:300]}")
        return
    if _float_scale(victim) > 100 * _base_scale(path):
        outcomes.counts["ill_conditioned"] += 1
        return
    try:
        want = onnxruntime(victim)
    except Exception:  # no oracle: a case to look at, not judged
        outcomes.counts["ort_refused"] += 1
        return
    if _same(value, want):
        outcomes.counts["correct"] += 1
        return
    outcomes.counts["wrong_result"] += 1
    outcomes.findings.append(f"{what}: result differs from onnxruntime's")
