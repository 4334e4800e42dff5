"""SessionOptions are validated when set, and every onnxruntime field has one decision (issue 13 / 15)."""

import warnings

import pytest

from onnx_prepared import SessionOptions
from onnx_prepared import options as O
from onnx_prepared.errors import InvalidOptionError, OnnxPreparedError, UnknownOptionError


@pytest.mark.parametrize(("text", "n"), [("64MiB", 64 << 20), ("1.5GB", 1_500_000_000), ("4096", 4096),
                                         ("512 KiB", 512 << 10), ("2gib", 2 << 30), (1 << 20, 1 << 20)])
def test_byte_sizes_accept_ints_and_strings(text, n):
    so = SessionOptions()
    so.prepared_memory_limit = text
    so.memory_limit = text
    assert so.prepared_memory_limit == n and so.memory_limit == n


@pytest.mark.parametrize("bad", [0, -5, "64 parsecs", "", "MiB", 1.5, True, [1]])
def test_byte_sizes_reject_zero_negative_and_junk_naming_the_option(bad):
    with pytest.raises(InvalidOptionError, match=r"prepared_memory_limit.*positive byte count") as e:
        SessionOptions().prepared_memory_limit = bad
    assert isinstance(e.value, OnnxPreparedError) and e.value.option == "prepared_memory_limit"


def test_bogus_policy_names_the_allowed_values():
    so = SessionOptions()
    with pytest.raises(InvalidOptionError, match="'disabled', 'read_only', 'build_if_missing', 'require_complete'"):
        so.prepared_model_policy = "sometimes"
    from onnx_prepared.prepared.cache import PreparedModelPolicy

    so.prepared_model_policy = PreparedModelPolicy.READ_ONLY  # an enum member stands for its value
    assert so.prepared_model_policy == "read_only"


@pytest.mark.parametrize(("name", "bad"), [("intra_op_num_threads", -1), ("intra_op_num_threads", "2"),
                                           ("io_workers", 0), ("blas_threads", 0), ("trace", 1),
                                           ("eviction_policy", "maybe"), ("arena_retention_caps", {"gpu": 1}),
                                           ("graph_optimization_level", 7), ("execution_mode", "parallel"),
                                           ("log_severity_level", 9), ("prepared_model_path", 3),
                                           ("progress", 5)])
def test_wrong_types_and_ranges_raise_when_set(name, bad):
    with pytest.raises(InvalidOptionError, match=f"SessionOptions.{name} = .* expected "):
        setattr(SessionOptions(), name, bad)
    with pytest.raises(InvalidOptionError, match=name):
        SessionOptions(**{name: bad})


def test_a_misspelt_option_is_an_error_with_a_suggestion():
    with pytest.raises(UnknownOptionError, match="did you mean 'prepared_memory_limit'"):
        SessionOptions().prepared_memory_limt = 5
    assert isinstance(UnknownOptionError("x", 1, "y"), AttributeError)  # like onnxruntime's pybind object


def test_every_onnxruntime_field_has_a_decision_and_the_same_default():
    ort = pytest.importorskip("onnxruntime")
    theirs = ort.SessionOptions()
    fields = {n for n in dir(theirs) if not n.startswith("_") and not callable(getattr(theirs, n))}
    assert fields <= set(O.ORT_FIELDS), f"undecided onnxruntime fields: {sorted(fields - set(O.ORT_FIELDS))}"
    for name in fields:
        default = O.ORT_FIELDS[name][0]
        value = getattr(theirs, name)
        assert (int(value) if not isinstance(value, (str, bool)) else value) == default, name
    so = SessionOptions()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its defaults, enum members included, are ours: nothing to warn about
        for name in fields:
            setattr(so, name, getattr(theirs, name))


def test_fields_without_effect_warn_once_saying_so(monkeypatch):
    monkeypatch.setattr(O, "_warned", set())
    so = SessionOptions()
    with pytest.warns(O.OptionIgnoredWarning, match="inter_op_num_threads has no effect"):
        so.inter_op_num_threads = 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        so.inter_op_num_threads = 2  # once per process
        SessionOptions().inter_op_num_threads = 3
        so.enable_cpu_mem_arena = True  # the default: nothing to warn about
    for name, (_default, _v, honoured, _why) in O.ORT_FIELDS.items():
        assert isinstance(honoured, bool) and _why, name


def test_honoured_onnxruntime_fields_change_the_session(tmp_path):
    from onnx_prepared.runtime import RuntimeSession
    from tests.helpers.models import gemm_mlp

    path = gemm_mlp(tmp_path)
    so = SessionOptions(enable_profiling=True, intra_op_num_threads=1)
    with RuntimeSession(path, so) as sess:
        assert sess.scheduler.trace is not None  # enable_profiling records the task trace
        assert sess.intra_op_threads == 1  # intra_op_num_threads: the threads one kernel call may use


def test_dict_options_are_validated_too(tmp_path):
    from onnx_prepared.runtime import RuntimeSession
    from tests.helpers.models import gemm_mlp

    with pytest.raises(InvalidOptionError, match="prepared_memory_limit"):
        RuntimeSession(gemm_mlp(tmp_path), {"prepared_memory_limit": -5})
