"""onnx's backend node tests, loaded and compared the way ``onnx.backend.test.runner`` does.

The installed ``onnx`` wheel generates its ~1,900 node cases in memory (``load_model_tests(kind="node")``
builds each model and its input/expected-output arrays); nothing is copied or written. Shared by
``test_node_conformance.py`` and ``report.py``, which must judge a result identically.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

KNOWN_FAILURES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "known_failures.txt")


@functools.lru_cache(maxsize=1)
def load_cases() -> tuple:
    """Every node test case, sorted by name (generation prints numpy overflow warnings: silenced)."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return tuple(sorted(cases, key=lambda c: c.name))


#: Reason prefix in known_failures.txt for ops with random outputs (never comparable, sometimes equal by chance).
RANDOM = "random output"


def known_failures(path: str = KNOWN_FAILURES_FILE) -> dict[str, str]:
    """``test_name  # reason`` lines -> {name: reason}; blank lines and ``#`` comment lines ignored."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("#")
            out[name.strip()] = reason.strip() or "known failure"
    return out


def to_value(v: Any) -> Any:
    """A case's stored input/output as a runtime value (TensorProto -> ndarray, numpy scalar -> 0-d array)."""
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SequenceProto):
        return numpy_helper.to_list(v)
    if isinstance(v, onnx.OptionalProto):
        return numpy_helper.to_optional(v)
    if isinstance(v, (list, tuple)):
        return [to_value(x) for x in v]
    if isinstance(v, np.generic):
        return np.asarray(v)
    return v


def feeds_of(model: onnx.ModelProto, inputs: Sequence[Any]) -> dict[str, Any]:
    """Positional case inputs bound to the graph's input names (the runner's ``run(inputs)``)."""
    return {i.name: to_value(v) for i, v in zip(model.graph.input, inputs)}


def assert_similar_outputs(expected: Sequence[Any], got: Sequence[Any], rtol: float, atol: float) -> None:
    """onnx runner's ``assert_similar_outputs``: count, then per value shape, dtype and allclose (NaN equal).

    Sequences compare element by element; an empty optional (None) must match None.
    """
    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, got)):
        _assert_similar(to_value(ref), out, rtol, atol, f"output {i}")


def _assert_similar(ref: Any, out: Any, rtol: float, atol: float, where: str) -> None:
    if ref is None or out is None:
        assert ref is None and out is None, f"{where}: got {type(out).__name__}, expected {type(ref).__name__}"
        return
    if isinstance(ref, list):
        assert isinstance(out, (list, tuple)), f"{where}: got {type(out).__name__}, expected a sequence"
        assert len(out) == len(ref), f"{where}: sequence of {len(out)}, expected {len(ref)}"
        for j, (r, o) in enumerate(zip(ref, out)):
            _assert_similar(r, o, rtol, atol, f"{where}[{j}]")
        return
    assert isinstance(out, np.ndarray), f"{where}: got {type(out).__name__}, expected ndarray"
    np.testing.assert_array_equal(out.shape, ref.shape, err_msg=f"{where} has incorrect shape")
    if ref.dtype == object:
        np.testing.assert_array_equal(out, ref, err_msg=where)
        return
    np.testing.assert_equal(out.dtype, ref.dtype, err_msg=f"{where} has incorrect dtype")
    if ref.dtype.isbuiltin != 1:  # ml_dtypes (bfloat16, float8, int4): numpy cannot promote them
        if ref.dtype.name == "bfloat16":
            rtol = max(rtol, 2**-6)  # two bfloat16 ULPs, as the runner allows
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=where)


def assert_same_structure(expected: Sequence[Any], got: Sequence[Any]) -> None:
    """For random ops: same output count, shapes and dtypes; the values cannot be compared."""
    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, got)):
        ref = to_value(ref)
        assert isinstance(out, np.ndarray), f"output {i}: got {type(out).__name__}, expected ndarray"
        assert (out.shape, out.dtype) == (ref.shape, ref.dtype), f"output {i}: {out.dtype}{out.shape}"


def run_case(make_session, case, *, structure_only: bool = False) -> None:
    """Run every data set of ``case`` through ``make_session(model).run(None, feeds)`` and compare."""
    sess = make_session(case.model)
    for inputs, expected in case.data_sets:
        got = sess.run(None, feeds_of(case.model, inputs))
        if structure_only:
            assert_same_structure(expected, got)
        else:
            assert_similar_outputs(expected, got, case.rtol, case.atol)
