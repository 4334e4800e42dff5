"""Verification records are saved once a run's reads are verified, not only at close (a replica killed
without closing must not leave every later process to hash the weights again)."""

from __future__ import annotations

import os

import numpy as np
import onnx

from onnx_prepared.model import reader as reader_mod
from onnx_prepared.model import verified
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import add_checksums, gemm_mlp, reference_mlp

X = np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)


def _external(path) -> int:
    return sum(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(path, load_external_data=False).graph.initializer)


def test_records_exist_after_the_first_run_before_close(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))
    monkeypatch.setattr(verified, "RACY_S", 0.0)  # the model is seconds old: record it anyway
    path = gemm_mlp(tmp_path, layers=3, seed=1)
    add_checksums(path)
    folder = verified.default_dir()
    s = RuntimeSession(path)
    try:
        np.testing.assert_allclose(s.run({"x": X})[0], reference_mlp(path, X), rtol=1e-5, atol=1e-6)
        reader = s.state.reader.reader
        reader.wait_records()  # the save runs on a thread of its own, off the run's path
        names = [n for n in os.listdir(folder) if n.endswith(verified.SUFFIX)]
        assert len(names) == 1  # one data file
        data_file = os.path.join(os.path.dirname(path), onnx.load(path, load_external_data=False)
                                 .graph.initializer[0].external_data[0].value)
        st = os.stat(data_file)
        assert len(verified.load(folder, data_file, reader_mod.fingerprint(st))) == _external(path)
        # a second process (here: session) killed before closing would now trust them: no hash at all
        calls: list[int] = []
        real = reader_mod.sha256_chunked
        monkeypatch.setattr(reader_mod, "sha256_chunked", lambda buf, stop=None: calls.append(1) or real(buf, stop))
        with RuntimeSession(path) as s2:
            s2.run({"x": X})
        assert calls == []
    finally:
        s.close()
