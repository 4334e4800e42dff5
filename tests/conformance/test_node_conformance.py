"""onnx's backend node tests through ``onnx_prepared.InferenceSession``, compared as onnx's runner does.

One pytest case per node test (ids are the test names). Cases in ``known_failures.txt`` are
``xfail(strict=True)``: fixing one makes the suite fail until its line is removed. Random-output ops
(reason starting with "random output") are checked for output count, shapes and dtypes, then xfailed.
"""

from __future__ import annotations

import pytest

import onnx_prepared
from tests.conformance.node_cases import RANDOM, known_failures, load_cases, run_case

# The cases deliberately hit overflow, NaN and division by zero; numpy warns about each.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CASES = load_cases()
KNOWN = known_failures()


def _params():
    for case in CASES:
        marks = ()
        if case.name in KNOWN and not KNOWN[case.name].startswith(RANDOM):
            marks = (pytest.mark.xfail(strict=True, reason=KNOWN[case.name]),)
        yield pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_node(case):
    if case.name.startswith("test_image_decoder"):
        pytest.importorskip("PIL", reason="onnx.reference's ImageDecoder needs Pillow")
    if KNOWN.get(case.name, "").startswith(RANDOM):
        # Values may match by chance, so strict xfail would flake: check what is checkable, then xfail.
        run_case(onnx_prepared.InferenceSession, case, structure_only=True)
        pytest.xfail(KNOWN[case.name])
    run_case(onnx_prepared.InferenceSession, case)


def test_known_failures_name_real_cases():
    names = {c.name for c in CASES}
    assert sorted(set(KNOWN) - names) == []
    assert len(CASES) > 1800  # the wheel still generates the full node suite
