"""``IOBinding``: bind inputs and outputs by name, run, then fetch the outputs (onnxruntime's API).

On a CPU-only runtime binding is bookkeeping: bound inputs are the feeds, and a pre-allocated bound
output (``bind_ortvalue_output`` or a ``buffer_ptr``-less ``bind_output`` with a shape) receives the
result by copy; other bound outputs are returned as produced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from onnx_prepared.compat.ortvalue import OrtValue, _cpu_only
from onnx_prepared.errors import InvalidFeedError

if TYPE_CHECKING:
    from onnx_prepared.inference_session import InferenceSession


class IOBinding:
    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, OrtValue | None] = {}  # name -> pre-allocated destination, or None
        self._results: list[OrtValue] = []

    # ---- inputs ----
    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: Any,
                   buffer_ptr: int) -> None:
        raise NotImplementedError("bind_input with a raw buffer_ptr is not supported: use bind_cpu_input(name, "
                                  "array) or bind_ortvalue_input(name, OrtValue)")

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = ortvalue.numpy()

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    # ---- outputs ----
    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Any = None, buffer_ptr: int | None = None) -> None:
        _cpu_only(device_type)
        if buffer_ptr is not None:
            raise NotImplementedError("bind_output with a raw buffer_ptr is not supported: bind an OrtValue with "
                                      "bind_ortvalue_output(name, OrtValue.ortvalue_from_shape_and_type(...))")
        self._check_output(name)
        dest = None
        if shape is not None and element_type is not None:
            dest = OrtValue.ortvalue_from_shape_and_type(shape, element_type)
        self._outputs[name] = dest

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._check_output(name)
        self._outputs[name] = ortvalue

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    # ---- results ----
    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        return [np.array(v.numpy(), copy=True) if v.is_tensor() else v.numpy() for v in self._results]

    def synchronize_inputs(self) -> None:
        """CPU only: nothing to wait for."""

    def synchronize_outputs(self) -> None:
        """CPU only: nothing to wait for."""

    def _check_output(self, name: str) -> None:
        names = [o.name for o in self._session.get_outputs()]
        if name not in names:
            raise InvalidFeedError(f"cannot bind output {name!r}: the model's outputs are {names}")

    def _run(self, run_options: Any = None) -> None:
        names = list(self._outputs) or None
        values = self._session.run(names, self._inputs, run_options)
        results = []
        for name, v in zip(names or [o.name for o in self._session.get_outputs()], values):
            dest = self._outputs.get(name)
            if dest is not None and dest.is_tensor():
                buf = dest.numpy()
                if buf.shape != np.shape(v) or buf.dtype != np.asarray(v).dtype:
                    raise InvalidFeedError(f"bound output {name!r} is {buf.dtype}{list(buf.shape)}, the run produced "
                                           f"{np.asarray(v).dtype}{list(np.shape(v))}")
                np.copyto(buf, v)
                results.append(dest)
            else:
                results.append(OrtValue(v))
        self._results = results
