"""``OrtValue``: onnxruntime's value handle, here a thin CPU wrapper around a numpy array (or a
sequence/map/None for non-tensor values). ``numpy()`` returns the array itself, never a copy."""

from __future__ import annotations

from typing import Any

import numpy as np

_ORT_TYPE = {"float32": "float", "float64": "double", "object": "string", "bool": "bool"}


def _type_name(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    return _ORT_TYPE.get(name, name)


class OrtValue:
    """A CPU value. Build one with :meth:`ortvalue_from_numpy` or :meth:`ortvalue_from_shape_and_type`."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    # ---- constructors ----
    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        _cpu_only(device_type)
        if not isinstance(numpy_obj, np.ndarray):
            raise TypeError(f"ortvalue_from_numpy expects a numpy array, got {type(numpy_obj).__name__}")
        return OrtValue(numpy_obj)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: np.ndarray, onnx_element_type: int) -> OrtValue:
        from onnx import helper

        return OrtValue(np.asarray(data).view(helper.tensor_dtype_to_np_dtype(onnx_element_type)))

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Any, element_type: Any = np.float32, device_type: str = "cpu",
                                     device_id: int = 0, vendor_id: int = -1) -> OrtValue:
        """An uninitialised tensor (``element_type`` a numpy dtype, or an ONNX TensorProto element type int)."""
        _cpu_only(device_type)
        if isinstance(element_type, int) and not isinstance(element_type, bool):
            from onnx import helper

            element_type = helper.tensor_dtype_to_np_dtype(element_type)
        return OrtValue(np.empty(tuple(shape), dtype=element_type))

    # ---- queries ----
    def numpy(self) -> Any:
        return self._value

    def is_tensor(self) -> bool:
        return isinstance(self._value, np.ndarray)

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def has_value(self) -> bool:
        return self._value is not None

    def shape(self) -> list[int]:
        return list(self._tensor().shape)

    def data_type(self) -> str:
        if isinstance(self._value, list):
            inner = _type_name(self._value[0].dtype) if self._value else "undefined"
            return f"seq(tensor({inner}))"
        return f"tensor({_type_name(self._tensor().dtype)})"

    def element_type(self) -> type:
        return self._tensor().dtype.type

    def device_name(self) -> str:
        return "cpu"

    def data_ptr(self) -> int:
        return int(self._tensor().ctypes.data)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy ``np_arr`` into this tensor's buffer (same shape and dtype), as onnxruntime does."""
        t = self._tensor()
        src = np.asarray(np_arr)
        if src.shape != t.shape or src.dtype != t.dtype:
            raise ValueError(f"update_inplace: got {src.dtype}{list(src.shape)}, "
                             f"this value is {t.dtype}{list(t.shape)}")
        np.copyto(t, src)

    def _tensor(self) -> np.ndarray:
        if not isinstance(self._value, np.ndarray):
            raise TypeError(f"this OrtValue holds a {type(self._value).__name__}, not a tensor")
        return self._value

    def __repr__(self) -> str:
        if isinstance(self._value, np.ndarray):
            return f"OrtValue({self.data_type()}, shape={self.shape()})"
        return f"OrtValue({type(self._value).__name__})"


def unwrap(v: Any) -> Any:
    return v._value if type(v) is OrtValue else v


def _cpu_only(device_type: str) -> None:
    if str(device_type).lower() != "cpu":
        raise ValueError(f"device_type {device_type!r}: onnx-prepared has only the CPU device ('cpu')")
