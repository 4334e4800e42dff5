"""External-data validation at load: each violation is an ExternalDataError naming tensor and file."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from onnx_prepared.errors import ExternalDataError, ModelLoadError
from onnx_prepared.model import ExternalDataReader, load_model
from tests.model.model_builders import Spec, write_model

W = np.arange(10, dtype=np.float32)  # 40 bytes at offset 0 of weights.bin (43 bytes with the trailer)


def _load_error(path, tensor: str, file: str, *needles: str) -> ExternalDataError:
    with pytest.raises(ExternalDataError) as ei:
        load_model(path)
    e = ei.value
    assert isinstance(e, ModelLoadError)
    assert (e.tensor, e.file) == (tensor, file)
    msg = str(e)
    for n in (repr(tensor), repr(file), *needles):
        assert n in msg, (n, msg)
    assert e.__cause__ is None and (e.__suppress_context__ or e.__context__ is None)
    return e


@pytest.mark.parametrize(
    ("location", "needle"),
    [
        ("/etc/passwd", "must be relative to the model folder"),
        ("C:\\weights.bin", "must be relative to the model folder"),
        ("\\\\server\\share\\weights.bin", "must be relative to the model folder"),
        ("../weights.bin", "escapes the model folder ('..')"),
        ("sub/../../weights.bin", "escapes the model folder ('..')"),
        ("sub/../weights.bin", "escapes the model folder ('..')"),  # conservative: any '..' component
        ("..\\weights.bin", "escapes the model folder ('..')"),
        ("bad\0name", "contains a NUL byte"),
        ("missing.bin", "external data file is missing"),
        ("sub", "location is not a regular file"),
        (".", "location is not a regular file"),
    ],
)
def test_bad_location(tmp_path, location, needle):
    (tmp_path / "sub").mkdir()
    path = write_model(tmp_path, [Spec("w", W, entries={"location": location})])
    _load_error(path, "w", location, needle)


def test_no_location(tmp_path):
    path = write_model(tmp_path, [Spec("w", W, entries={"location": None})])
    with pytest.raises(ExternalDataError, match="no location") as ei:
        load_model(path)
    assert ei.value.tensor == "w"


def test_symlink_pointing_outside(tmp_path):
    model_dir, outside = tmp_path / "m", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    write_model(outside, [Spec("w", W)])  # a real weights.bin outside the model folder
    (model_dir / "link.bin").symlink_to(outside / "weights.bin")
    path = write_model(model_dir, [Spec("w", W, entries={"location": "link.bin"})], data_name="unused.bin")
    _load_error(path, "w", "link.bin", "outside the model folder")


def test_symlinked_directory_pointing_outside(tmp_path):
    model_dir, outside = tmp_path / "m", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    write_model(outside, [Spec("w", W)])
    (model_dir / "sub").symlink_to(outside)
    path = write_model(model_dir, [Spec("w", W, entries={"location": "sub/weights.bin"})], data_name="unused.bin")
    _load_error(path, "w", "sub/weights.bin", "outside the model folder")


def test_symlink_inside_the_folder_is_fine(tmp_path):
    path = write_model(tmp_path, [Spec("w", W, entries={"location": "sub/link.bin"})])
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "link.bin").symlink_to(tmp_path / "weights.bin")
    m = load_model(path)
    assert m.weights["w"].payload.file == str(tmp_path / "weights.bin")  # resolved real path
    np.testing.assert_array_equal(ExternalDataReader().read(m.weights["w"]), W)


def test_model_folder_reached_through_a_symlink(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    write_model(real, [Spec("w", W)])
    (tmp_path / "alias").symlink_to(real)
    m = load_model(tmp_path / "alias" / "model.onnx")
    np.testing.assert_array_equal(ExternalDataReader().read(m.weights["w"]), W)


def test_fifo_is_not_a_data_file(tmp_path):
    os.mkfifo(tmp_path / "fifo.bin")
    path = write_model(tmp_path, [Spec("w", W, entries={"location": "fifo.bin"})])
    _load_error(path, "w", "fifo.bin", "not a regular file")  # and load did not block opening it


@pytest.mark.parametrize("key", ["offset", "length"])
@pytest.mark.parametrize("value", ["abc", "-1", "1.5", " 12", "1_0", "", "0x10"])
def test_non_integer_offset_or_length(tmp_path, key, value):
    path = write_model(tmp_path, [Spec("w", W, entries={key: value})])
    _load_error(path, "w", "weights.bin", key, "not a non-negative integer")


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ({"offset": "4"}, "offset 4 + length 40 runs past the end of the file (43 bytes)"),
        ({"offset": "100"}, "offset 100 lies past the end of the file"),
        ({"length": "44"}, "runs past the end"),
        ({"length": "36"}, "length 36 does not match FLOAT x [10] = 40 bytes"),
        ({"length": "41"}, "length 41 does not match"),  # within the file, still wrong
        ({"length": None}, "length 43 does not match"),  # absent: rest of file (with the 3-byte trailer)
        ({"offset": "1", "length": None}, "length 42 does not match"),
    ],
)
def test_bad_range(tmp_path, entries, needle):
    path = write_model(tmp_path, [Spec("w", W, entries=entries)])
    _load_error(path, "w", "weights.bin", needle)


def test_absent_length_means_rest_of_file(tmp_path):
    path = write_model(tmp_path, [Spec("w", W, entries={"length": None})], trailing=0)
    m = load_model(path)
    assert m.weights["w"].payload.length == 40
    np.testing.assert_array_equal(ExternalDataReader().read(m.weights["w"]), W)


def test_absent_offset_means_zero(tmp_path):
    path = write_model(tmp_path, [Spec("w", W, entries={"offset": None})])
    assert load_model(path).weights["w"].payload.offset == 0


def test_packed_int4_length(tmp_path):
    import ml_dtypes

    v = np.array([1, -2, 3, -4, 5], dtype=ml_dtypes.int4)  # 5 nibbles -> 3 bytes
    m = load_model(write_model(tmp_path, [Spec("q", v)]))
    assert m.weights["q"].nbytes == 3
    bad = write_model(tmp_path, [Spec("q", v, entries={"length": "5"})], model_name="bad.onnx")
    _load_error(bad, "q", "weights.bin", "length 5 does not match INT4 x [5] = 3 bytes")


def test_external_string_tensor(tmp_path):
    path = write_model(tmp_path, [Spec("w", W)])
    m = onnx.load(path, load_external_data=False)
    m.graph.initializer[0].data_type = onnx.TensorProto.STRING
    onnx.save(m, path)
    _load_error(path, "w", "weights.bin", "STRING")


@pytest.mark.parametrize(("data_type", "needle"), [(0, "UNDEFINED"), (999, "unknown element type 999")])
def test_external_bad_element_type(tmp_path, data_type, needle):
    path = write_model(tmp_path, [Spec("w", W)])
    m = onnx.load(path, load_external_data=False)
    m.graph.initializer[0].data_type = data_type
    onnx.save(m, path)
    _load_error(path, "w", "weights.bin", needle)


def test_external_negative_dim(tmp_path):
    path = write_model(tmp_path, [Spec("w", W)])
    m = onnx.load(path, load_external_data=False)
    m.graph.initializer[0].dims[0] = -10
    onnx.save(m, path)
    _load_error(path, "w", "weights.bin", "negative dimension")


def test_first_bad_tensor_is_named(tmp_path):
    """Many tensors share a file; the one with the bad range is the one named."""
    specs = [Spec(f"ok{i}", W) for i in range(5)] + [Spec("bad", W, entries={"length": "8"})]
    _load_error(write_model(tmp_path, specs), "bad", "weights.bin", "length 8")
