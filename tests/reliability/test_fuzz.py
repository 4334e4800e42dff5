"""Fuzz campaign, CI size: mutated ModelProto fields, TensorProto dims/types/external-data entries,
serialized model bytes, companion manifests and payload bytes. Allowed outcomes: a correct result or an
onnx_prepared error within a time bound (see tests/reliability/fuzzing.py; the long run is
tools/fuzz_campaign.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.reliability import fuzzing as F

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    path = F.make_base(str(folder / "m"))
    companion = F.build_companion(path)
    return path, companion, str(folder)


def _check(outcomes):
    assert not outcomes.findings, outcomes.findings[:5]


@SETTINGS
@given(mut=F.model_mutation())
def test_fuzz_model_fields(base, mut):
    out = F.Outcomes()
    F.run_model_case(base[0], os.path.join(base[2], "work-model"), mut, out)
    _check(out)


@SETTINGS
@given(mut=F.bytes_mutation())
def test_fuzz_model_bytes(base, mut):
    out = F.Outcomes()
    F.run_model_case(base[0], os.path.join(base[2], "work-bytes"), mut, out, as_bytes=True)
    _check(out)


@SETTINGS
@given(mut=F.companion_mutation())
def test_fuzz_companion(base, mut):
    out = F.Outcomes()
    F.run_companion_case(base[0], base[1], os.path.join(base[2], "work-companion"), mut, out)
    _check(out)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two exported models of the corpus (tests/helpers/corpus.py), built once per test session: a
    torchvision-style CNN at opset 9 and onnxruntime's static INT8 QDQ quantization of a small SE CNN."""
    pytest.importorskip("torch")
    from tests.helpers import corpus_cache

    folder = corpus_cache.shared_dir(tmp_path_factory)
    return {name: corpus_cache.get(folder, name) for name in ("bn_cnn_opset9", "cnn_int8_qdq")}


@pytest.mark.parametrize("name", ["bn_cnn_opset9", "cnn_int8_qdq"])
def test_fuzz_exported_model_bytes(exported, tmp_path, name):
    cm = exported[name]

    @SETTINGS
    @given(muts=F.exported_mutation())
    def run(muts):
        out = F.Outcomes()
        F.run_exported_case(cm.path, cm.feeds[0], str(tmp_path / "w"), muts, out)
        _check(out)

    run()


def test_known_finding_initializer_as_only_output(base, tmp_path):
    out = F.Outcomes()
    F.run_model_case(base[0], str(tmp_path / "w"), ("output_name", "W0"), out)
    _check(out)


def test_known_finding_gemm_without_a(base, tmp_path):
    out = F.Outcomes()
    F.run_model_case(base[0], str(tmp_path / "w"), ("drop_input", 0), out)
    _check(out)


def test_known_finding_wrongly_typed_attribute(base, tmp_path):
    out = F.Outcomes()
    F.run_model_case(base[0], str(tmp_path / "w"), ("attr", "alpha", 0), out)
    _check(out)
