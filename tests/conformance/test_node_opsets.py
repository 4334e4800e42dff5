"""onnx's node cases at the older opsets of their ops (see ``opset_cases``), compared with onnxruntime.

Cases in ``known_failures_opsets.txt`` are ``xfail(strict=True)``; a variant onnxruntime itself cannot
run is skipped (nothing to compare with).
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

import onnx_prepared
from tests.conformance.node_cases import feeds_of
from tests.conformance.opset_cases import (
    OnnxruntimeUnavailable,
    assert_matches_reference,
    known_failures,
    load_opset_cases,
    reference_outputs,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CASES = load_opset_cases()
KNOWN = known_failures()


def _params():
    for oc in CASES:
        marks = (pytest.mark.xfail(strict=True, reason=KNOWN[oc.name]),) if oc.name in KNOWN else ()
        yield pytest.param(oc, id=oc.name, marks=marks)


@pytest.mark.parametrize("oc", list(_params()))
def test_node_at_older_opset(oc):
    try:
        expected = reference_outputs(oc)
    except OnnxruntimeUnavailable as e:
        pytest.skip(f"onnxruntime cannot run this variant: {e}")
    sess = onnx_prepared.InferenceSession(oc.model)
    got = [sess.run(None, feeds_of(oc.model, inputs)) for inputs, _ in oc.case.data_sets]
    assert_matches_reference(oc, got, expected)


def test_sweep_covers_old_opsets():
    names = {oc.name for oc in CASES}
    assert sorted(set(KNOWN) - names) == []
    assert len(CASES) > 1500
    assert {"test_batchnorm_example@9", "test_batchnorm_epsilon@9", "test_globalmaxpool@1"} & names
    assert min(int(n.rsplit("@", 1)[1]) for n in names) == 7
