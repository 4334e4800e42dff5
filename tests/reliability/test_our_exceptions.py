"""Every failure a user sees is an onnx_prepared error: closed sessions whatever the scheduler, worker
counts the scheduler cannot honour."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared import RuntimeSession
from onnx_prepared.errors import ClosedError, InvalidOptionError
from onnx_prepared.scheduler import CpuExecutor, RuntimeScheduler
from tests.helpers.models import gemm_mlp

X = np.zeros((1, 16), np.float32)


@pytest.mark.parametrize("opts", [{}, {"trace": True}, {"io_workers": 2}], ids=["default", "own", "own-io"])
def test_run_after_close_is_one_clear_error_whatever_the_scheduler(tmp_path, opts):
    s = RuntimeSession(gemm_mlp(tmp_path), opts)
    s.run({"x": X})
    s.close()
    for call in (lambda: s.run({"x": X}), lambda: s.run_async({"x": X}), s.prepare, s.prepare_async):
        with pytest.raises(ClosedError, match="closed RuntimeSession"):
            call()
    s.close()  # idempotent


def test_closed_external_scheduler_is_our_error(tmp_path):
    sched = RuntimeScheduler()
    sched.close()
    with RuntimeSession(gemm_mlp(tmp_path), scheduler=sched) as s, pytest.raises(ClosedError):
        s.run({"x": X})


def test_one_io_worker_runs(tmp_path):
    with RuntimeSession(gemm_mlp(tmp_path), {"io_workers": 1}) as s:
        (y,) = s.run({"x": X})
    assert y.shape == (1, 16)
    RuntimeScheduler(io_workers=1).close()


@pytest.mark.parametrize("make, option", [
    (lambda: RuntimeScheduler(io_workers=-1), "io_workers"),
    (lambda: RuntimeScheduler(io_workers=0), "io_workers"),
    (lambda: RuntimeScheduler(io_workers=2, io_reserved=2), "io_workers"),
    (lambda: CpuExecutor(-1), "cpu_workers"),
    (lambda: CpuExecutor(1, critical_reserved=1), "cpu_workers"),
])
def test_bad_worker_counts_name_the_option(make, option):
    with pytest.raises(InvalidOptionError, match=option) as ei:
        make()
    assert "reserved slots" not in str(ei.value)
