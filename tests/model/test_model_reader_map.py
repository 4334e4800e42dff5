"""map_readonly: file mappings that hold no descriptor, read-only, unmapped with their last view."""

from __future__ import annotations

import gc
import mmap
import os

import numpy as np
import pytest

from onnx_prepared.model import reader_map


def _maps_of(path) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(str(path)))


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "w.data"
    v = (np.arange(3 * mmap.ALLOCATIONGRANULARITY, dtype=np.uint32) * 2654435761).astype(np.uint32)
    v.tofile(path)
    return path, v.view(np.uint8)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_a_mapping_keeps_no_descriptor_and_ends_with_its_last_view(data):
    """64 live mappings of one file add no open descriptor (mmap.mmap keeps a dup of each; crossing 64
    makes the kernel grow the descriptor table, which stalls every thread that opens a file), read the
    file's bytes, refuse writes, and are unmapped once the arrays made from them are gone."""
    path, want = data
    g = mmap.ALLOCATIONGRANULARITY
    fd = os.open(path, os.O_RDONLY)
    try:
        before = len(os.listdir("/proc/self/fd"))
        arrays = [reader_map.map_readonly(fd, g, 2 * g)[7 + i: 107 + i] for i in range(64)]
        assert len(os.listdir("/proc/self/fd")) == before
        assert _maps_of(path) == 64
        for i, a in enumerate(arrays):
            np.testing.assert_array_equal(a, want[g + 7 + i: g + 107 + i])
        assert not arrays[0].flags.writeable
        with pytest.raises(ValueError):
            arrays[0].flags.writeable = True
        sub = arrays[5][10:20]  # a view of a view keeps the mapping too
        del arrays, a
        gc.collect()
        assert _maps_of(path) == 1
        np.testing.assert_array_equal(sub, want[g + 22: g + 32])
        del sub
        gc.collect()
        assert _maps_of(path) == 0
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_an_unpopulated_mapping_reads_the_same_bytes_and_is_marked_mapped(data):
    path, want = data
    fd = os.open(path, os.O_RDONLY)
    try:
        m = reader_map.map_readonly(fd, 0, len(want), populate=False)
        assert reader_map.is_mapped(m[3:9]) and not reader_map.is_mapped(np.array(m[3:9]))
        np.testing.assert_array_equal(m, want)
        del m
        assert _maps_of(path) == 0  # the last reference gone: unmapped at once
    finally:
        os.close(fd)


def test_an_unmappable_descriptor_raises_oserror(tmp_path):
    r, w = os.pipe()
    try:
        with pytest.raises(OSError):
            reader_map.map_readonly(r, 0, 4096)
    finally:
        os.close(r)
        os.close(w)
