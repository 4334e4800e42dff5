"""The BLAS thread count of numpy's bundled OpenBLAS, set through its own C API.

Why: OpenBLAS starts one thread per core for every large GEMM. While the session's preparation worker
is reading and prepacking on the other core, those threads oversubscribe the machine and a 2-thread
GEMM can run many times slower than a 1-thread one (measured on tiny-llm prefill: 376 ms -> 61 ms at
load 4); and its results depend on the thread count. :mod:`onnx_prepared.kernels.threads` therefore
keeps it fixed for every run (default 1); this module is the only place that calls OpenBLAS.

Works on the OpenBLAS numpy ships (``scipy_openblas*`` symbols) and on a system OpenBLAS; with any
other BLAS it does nothing (``available()`` is False). No third-party dependency (threadpoolctl does
the same discovery more generally; it is not a runtime dependency here).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

_lock = threading.Lock()
_api: tuple | None = None  # (get, set) or () when unavailable
_default: int | None = None
_current: int | None = None


def _openblas_libs():
    """The OpenBLAS libraries numpy's wheel ships, loaded (numpy.libs on Linux, .dylibs on macOS)."""
    import numpy as np

    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs", "*openblas*"))
    libs += glob.glob(os.path.join(os.path.dirname(np.__file__), ".dylibs", "*openblas*"))
    for path in libs:
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue


def _load() -> tuple:
    global _api, _default
    if _api is not None:
        return _api
    for lib in _openblas_libs():
        for get_name, set_name in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                                   ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                                   ("openblas_get_num_threads", "openblas_set_num_threads")):
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype = ctypes.c_int
                set_.argtypes = [ctypes.c_int]
                _api = (get, set_)
                _default = int(get())
                return _api
    _api = ()
    return _api


def available() -> bool:
    return bool(_load())


def default_threads() -> int | None:
    _load()
    return _default


def set_threads(n: int | None) -> None:
    """Set OpenBLAS's thread count (None: its default). Cheap when unchanged; process-wide."""
    global _current
    api = _load()
    if not api:
        return
    n = _default if n is None else max(1, int(n))
    if n == _current:
        return
    with _lock:
        api[1](n)
        _current = n


_sgemm: tuple[int, bool] | bool | None = False  # False: not looked up yet


def sgemm_address() -> tuple[int, bool] | None:
    """(address, ilp64) of the OpenBLAS ``cblas_sgemm`` numpy uses, or None (another BLAS, or none found).

    The native conv GEMM (``_native/conv_gemm.c``) calls it from the extension's pool, one column or row
    block per task, with OpenBLAS kept single-threaded (the blocks are fixed by shape, so results do not
    depend on the thread count).
    """
    global _sgemm
    if _sgemm is not False:
        return _sgemm
    _sgemm = None
    for lib in _openblas_libs():
        for name, ilp64 in (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("cblas_sgemm", False)):
            fn = getattr(lib, name, None)
            if fn is not None:
                _sgemm = (ctypes.cast(fn, ctypes.c_void_p).value, ilp64)
                return _sgemm
    return _sgemm


def current_threads() -> int | None:
    """OpenBLAS's thread count now (None without OpenBLAS)."""
    api = _load()
    return int(api[0]()) if api else None
