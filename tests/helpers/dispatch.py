"""The compute paths a kernel test runs on: numpy (the extension switched off) and every native dispatch
level this CPU supports (forced with ``native.forced_level``)."""

from onnx_prepared.kernels import native

PATHS = ("numpy", *native.supported_levels())


def use_path(path: str, monkeypatch):
    """Generator for a fixture: run the test body on ``path``."""
    if path == "numpy":
        monkeypatch.setattr(native, "_ext", None)
        yield path
    else:
        with native.forced_level(path):
            yield path
