"""onnx's protobuf classes and operator schemas without running ``onnx/__init__`` (start-up cost).

``import onnx`` spends most of its time in ``onnx.helper``, ``onnx.compose``, protobuf's json_format
and importlib.metadata, none of which parsing a model and building a session needs. This module makes
onnx's ``onnx_ml_pb2`` module (built on upb directly where that is protobuf's backend, see
:func:`_load_pb2_upb`) and, on first use of :data:`defs`, loads its ``onnx_cpp2py_export`` extension,
both registered under their own names in ``sys.modules``, so a later ``import onnx`` reuses them: a
``ModelProto`` made with the real package is the same class as ours. If anything about that fails, or
``onnx`` is already imported, the real package is used. Any other name (``numpy_helper``, ``checker``, ...) is looked up
in the real ``onnx`` package, imported on first such access.

It also holds the few helper functions the start-up path needs (dtype maps, attribute values) so that
``onnx.helper`` loads only for types and cases they do not cover.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np


def _load_file(name: str, path: str, loader_cls=None) -> ModuleType:
    if loader_cls is None:
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        spec = importlib.util.spec_from_file_location(name, path, loader=loader_cls(name, path))
    if spec is None or spec.loader is None:
        raise ImportError(name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def _onnx_root() -> str:
    spec = importlib.util.find_spec("onnx")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("onnx")
    return next(iter(spec.submodule_search_locations))


_SERIALIZED = "AddSerializedFile("


def _load_pb2_upb(root: str) -> ModuleType:
    """``onnx.onnx_ml_pb2`` built straight on upb (protobuf's default C backend).

    The generated module's own import goes through ``google.protobuf.descriptor_pool``, which imports
    the pure-Python message implementation (python_message, text_format, encoder/decoder: about half
    of protobuf's import time) even when upb does the work. This reads the generated file's serialized
    descriptor, adds it to upb's default pool (the pool ``descriptor_pool.Default()`` returns later)
    and makes the message classes and top-level enums the way ``internal.builder`` does. Symbol
    database registration is left out: nothing looks onnx's messages up by name.
    """
    import ast

    from google._upb import _message as upb  # raises where upb is not the backend
    from google.protobuf import message
    from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

    with open(os.path.join(root, "onnx_ml_pb2.py"), encoding="utf-8") as f:
        src = f.read()
    start = src.index(_SERIALIZED) + len(_SERIALIZED)
    data = ast.literal_eval(src[start: src.index(")\n", start)])
    if not isinstance(data, bytes):
        raise ImportError("unexpected onnx_ml_pb2 layout")
    file_desc = upb.default_pool.AddSerializedFile(data)
    name = "onnx.onnx_ml_pb2"
    mod = ModuleType(name)
    mod.__file__ = os.path.join(root, "onnx_ml_pb2.py")
    ns = mod.__dict__
    ns["DESCRIPTOR"] = file_desc

    def build(desc, prefix: str):
        body = {n: build(sub, f"{prefix}{desc.name}.") for n, sub in desc.nested_types_by_name.items()}
        body.update(DESCRIPTOR=desc, __module__=name, __qualname__=prefix + desc.name)
        return upb.MessageMeta(desc.name, (message.Message,), body)

    for enum_name, enum_desc in file_desc.enum_types_by_name.items():
        ns[f"_{enum_name.upper()}"] = enum_desc
        ns[enum_name] = EnumTypeWrapper(enum_desc)
        for value in enum_desc.values:
            ns[value.name] = value.number
    for msg_name, desc in file_desc.message_types_by_name.items():
        ns[f"_{msg_name.upper()}"] = desc
        ns[msg_name] = build(desc, "")
    sys.modules[name] = mod
    return mod


def _load_pb2() -> ModuleType:
    """onnx_ml_pb2 loaded from onnx's package directory without its __init__ (upb-direct when possible)."""
    pb2 = sys.modules.get("onnx.onnx_ml_pb2")
    if pb2 is not None:
        return pb2
    root = _onnx_root()
    if os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "upb") == "upb":
        try:
            return _load_pb2_upb(root)
        except Exception:  # an unexpected protobuf/onnx layout: the generated module itself
            sys.modules.pop("onnx.onnx_ml_pb2", None)
    return _load_file("onnx.onnx_ml_pb2", os.path.join(root, "onnx_ml_pb2.py"))


def _ext_path() -> str | None:
    root = _onnx_root()
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(root, "onnx_cpp2py_export" + suffix)
        if os.path.isfile(path):
            return path
    return None


def _load_ext() -> ModuleType:
    """onnx's C++ extension (the operator schema registry), loaded on first use of :data:`defs`."""
    ext = sys.modules.get("onnx.onnx_cpp2py_export")
    if ext is not None:
        return ext
    path = _ext_path()
    if path is None:
        raise ImportError("onnx.onnx_cpp2py_export")
    return _load_file("onnx.onnx_cpp2py_export", path, importlib.machinery.ExtensionFileLoader)


def schema_build() -> str | None:
    """Names the installed onnx build's schemas without loading them: the extension's path, size and
    mtime (None if it cannot be found). What model/schemas.py keys its cache by."""
    try:
        path = _ext_path()
        if path is None:
            return None
        st = os.stat(path)
    except (ImportError, OSError, ValueError):
        return None
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _real_onnx() -> ModuleType:
    import onnx

    return onnx


_onnx = sys.modules.get("onnx")
_real = _onnx is not None and hasattr(_onnx, "ModelProto")
if _real:
    _pb2 = _onnx
else:
    try:
        _pb2 = _load_pb2()
        if not hasattr(_pb2, "ModelProto"):
            raise ImportError("unexpected onnx layout")
    except Exception:  # any surprise in onnx's layout: the real package, at its usual cost
        _pb2, _real = _real_onnx(), True

ModelProto = _pb2.ModelProto
GraphProto = _pb2.GraphProto
NodeProto = _pb2.NodeProto
TensorProto = _pb2.TensorProto
SparseTensorProto = _pb2.SparseTensorProto
AttributeProto = _pb2.AttributeProto
ValueInfoProto = _pb2.ValueInfoProto
TypeProto = _pb2.TypeProto
TensorShapeProto = _pb2.TensorShapeProto
FunctionProto = _pb2.FunctionProto
OperatorSetIdProto = _pb2.OperatorSetIdProto
StringStringEntryProto = _pb2.StringStringEntryProto
IR_VERSION = _pb2.IR_VERSION



def _make_defs() -> Any:
    """The subset of ``onnx.defs`` the loader uses, straight from the extension (the real package's
    ``onnx.defs`` when that is what we run on)."""
    if _real:
        return _real_onnx().defs
    try:
        C = _load_ext().defs
        if not hasattr(C, "get_schema"):
            raise ImportError("unexpected onnx layout")
    except Exception:  # the real package, at its usual cost
        return _real_onnx().defs

    def opset_version(domain: str) -> int:
        return C.schema_version_map()[domain][1]

    return SimpleNamespace(
        has=C.has_schema, get_schema=C.get_schema, get_all_schemas_with_history=C.get_all_schemas_with_history,
        OpSchema=C.OpSchema, SchemaError=C.SchemaError,
        onnx_opset_version=lambda: opset_version(""), onnx_ml_opset_version=lambda: opset_version("ai.onnx.ml"))


def __getattr__(name: str) -> Any:
    """``defs`` (the schema registry, loaded on first use: only validation reads it); everything else
    (numpy_helper, checker, shape_inference, __version__, ...) from the real onnx."""
    if name == "defs":
        value = globals()["defs"] = _make_defs()
        return value
    if name.startswith("__") and name != "__version__":
        raise AttributeError(name)
    return getattr(_real_onnx(), name)


_T = TensorProto
#: TensorProto data types numpy represents natively (the rest -- bfloat16, float8, int4, ... -- go
#: through onnx.helper, which maps them to ml_dtypes).
_NP = {_T.FLOAT: np.float32, _T.UINT8: np.uint8, _T.INT8: np.int8, _T.UINT16: np.uint16, _T.INT16: np.int16,
       _T.INT32: np.int32, _T.INT64: np.int64, _T.BOOL: np.bool_, _T.FLOAT16: np.float16, _T.DOUBLE: np.float64,
       _T.UINT32: np.uint32, _T.UINT64: np.uint64, _T.COMPLEX64: np.complex64, _T.COMPLEX128: np.complex128,
       _T.STRING: np.object_}
_NP = {k: np.dtype(v) for k, v in _NP.items()}
_TO_TENSOR = {v: k for k, v in _NP.items()}
#: the dtypes ``to_array`` reads itself (raw little-endian bytes or a plain typed field): every native one
#: but strings, and none on a big-endian host (a dict lookup instead of a dtype compare and a sys read)
_NATIVE = {k: v for k, v in _NP.items() if v != np.object_} if sys.byteorder == "little" else {}


def tensor_dtype_to_np_dtype(elem_type: int) -> np.dtype:
    """As ``onnx.helper.tensor_dtype_to_np_dtype``."""
    dt = _NP.get(elem_type)
    if dt is not None:
        return dt
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(elem_type)


def np_dtype_to_tensor_dtype(dtype: np.dtype) -> int:
    """As ``onnx.helper.np_dtype_to_tensor_dtype``."""
    t = _TO_TENSOR.get(np.dtype(dtype))
    if t is not None:
        return t
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(dtype)


_A = AttributeProto
_ATTR = {_A.FLOAT: lambda a: a.f, _A.INT: lambda a: a.i, _A.STRING: lambda a: a.s, _A.TENSOR: lambda a: a.t,
         _A.SPARSE_TENSOR: lambda a: a.sparse_tensor, _A.GRAPH: lambda a: a.g, _A.TYPE_PROTO: lambda a: a.tp,
         _A.FLOATS: lambda a: list(a.floats), _A.INTS: lambda a: list(a.ints),
         _A.STRINGS: lambda a: list(a.strings), _A.TENSORS: lambda a: list(a.tensors),
         _A.SPARSE_TENSORS: lambda a: list(a.sparse_tensors), _A.GRAPHS: lambda a: list(a.graphs),
         _A.TYPE_PROTOS: lambda a: list(a.type_protos)}


def get_attribute_value(attr: AttributeProto) -> Any:
    """As ``onnx.helper.get_attribute_value`` (which also raises for reference and undefined attributes)."""
    get = None if attr.ref_attr_name else _ATTR.get(attr.type)
    if get is None:
        from onnx import helper

        return helper.get_attribute_value(attr)
    return get(attr)


#: data_type -> (typed field, its storage dtype) for the types whose typed-field form is a plain cast.
_FIELDS = {_T.FLOAT: ("float_data", np.float32), _T.DOUBLE: ("double_data", np.float64),
           _T.INT32: ("int32_data", np.int32), _T.INT8: ("int32_data", np.int32), _T.UINT8: ("int32_data", np.int32),
           _T.INT64: ("int64_data", np.int64), _T.UINT32: ("uint64_data", np.uint64),
           _T.UINT64: ("uint64_data", np.uint64)}


_EXTERNAL = _T.EXTERNAL


def to_array(tensor: TensorProto) -> np.ndarray:
    """As ``onnx.numpy_helper.to_array``: raw little-endian data of a native dtype and the plain typed
    fields are read here, everything else (strings, 16-bit and sub-byte types, external data) there.

    A tensor that cannot be read (a data type onnx does not define, data that does not fill its dims) is
    a ModelLoadError naming it: onnx's KeyError / ValueError reached callers from tensors no load-time
    check sees, such as a Constant's value inside a Loop's If branch."""
    try:
        dt = _NATIVE.get(tensor.data_type)
        if dt is not None and tensor.data_location != _EXTERNAL and not tensor.HasField("segment"):
            dims = tensor.dims
            shape = tuple(dims) if dims else ()  # (a scalar's: tuple() of an empty container is ~1 us)
            if tensor.HasField("raw_data"):
                return np.frombuffer(tensor.raw_data, dtype=dt).reshape(shape)
            field = _FIELDS.get(tensor.data_type)
            if field is not None:
                return np.asarray(getattr(tensor, field[0]), dtype=field[1]).astype(dt).reshape(shape)
        from onnx import numpy_helper

        return numpy_helper.to_array(tensor)
    except (KeyError, ValueError, TypeError) as e:
        from onnx_prepared.errors import ModelLoadError

        name = repr(tensor.name) if tensor.name else "(unnamed)"
        raise ModelLoadError(f"tensor {name} (data type {tensor.data_type}, dims {list(tensor.dims)}) cannot be "
                             f"read: {type(e).__name__}: {str(e)[:200]}") from None
