import threading

import pytest

from onnx_prepared.model import ExternalDataReader


class GatedReader(ExternalDataReader):
    """A reader whose reads of chosen tensors block on an event the test controls (or fail)."""

    def __init__(self, gates=None, fail_once=()):
        super().__init__()
        self.gates = dict(gates or {})
        self.fail_once = set(fail_once)
        self.log = []
        self.started = {name: threading.Event() for name in self.gates}
        self._log_lock = threading.Lock()

    def read(self, desc):
        with self._log_lock:
            self.log.append(("start", desc.name))
        if desc.name in self.started:
            self.started[desc.name].set()
        gate = self.gates.get(desc.name)
        if gate is not None and not gate.wait(20):
            raise AssertionError(f"gate for {desc.name} never opened")
        if desc.name in self.fail_once:
            self.fail_once.discard(desc.name)
            raise OSError(f"injected read failure of {desc.name}")
        v = super().read(desc)
        with self._log_lock:
            self.log.append(("done", desc.name))
        return v

    def reads_of(self, name):
        return sum(1 for ev, n in self.log if ev == "done" and n == name)


@pytest.fixture
def gated_reader():
    return GatedReader
