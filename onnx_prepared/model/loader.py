"""Metadata-only model loading: parse the protobuf, describe every initializer, read no weight byte.

Every external-data entry is validated before anything can read it: the location must resolve inside
the model's folder (no absolute path, no ``..`` escape, no symlink pointing outside), the file must
exist, ``offset + length`` must lie within it and ``length`` must match dtype x dims.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import onnx
from google.protobuf.message import DecodeError

from onnx_prepared.errors import ExternalDataError, ModelLoadError
from onnx_prepared.model.descriptors import ExternalPayload, InlinePayload, WeightDescriptor

# Element types stored with fewer than 8 bits per element (packed two per byte).
_SUB_BYTE = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
for _name in ("FLOAT4E2M1", "INT2", "UINT2"):
    if hasattr(onnx.TensorProto, _name):
        _SUB_BYTE.add(getattr(onnx.TensorProto, _name))
_BITS = {getattr(onnx.TensorProto, n): 2 for n in ("INT2", "UINT2") if hasattr(onnx.TensorProto, n)}


@dataclass(frozen=True)
class LoadedModel:
    """A parsed model whose external weights are described, not read."""

    path: str
    base_dir: str
    model: onnx.ModelProto
    weights: Mapping[str, WeightDescriptor] = field(default_factory=dict)

    @property
    def graph(self) -> onnx.GraphProto:
        return self.model.graph

    @property
    def opsets(self) -> dict[str, int]:
        return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in self.model.opset_import}

    @property
    def functions(self) -> dict[tuple[str, str], onnx.FunctionProto]:
        return {(f.domain, f.name): f for f in self.model.functions}


def expected_nbytes(elem_type: int, dims: tuple[int, ...]) -> int | None:
    """Stored byte size of a tensor, or None for types without a fixed size (strings)."""
    if elem_type == onnx.TensorProto.STRING:
        return None
    numel = 1
    for d in dims:
        numel *= d
    if elem_type in _SUB_BYTE:
        bits = _BITS.get(elem_type, 4)
        return (numel * bits + 7) // 8
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    return numel * itemsize


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Parse ``path`` without loading external data and describe every initializer."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {path!r}") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {path!r}: {e.strerror}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"malformed ONNX protobuf in {path!r}: {e}") from None
    if not model.HasField("graph"):
        raise ModelLoadError(f"{path!r} is not an ONNX model (no graph)")
    base_dir = os.path.dirname(os.path.abspath(path))
    weights = {}
    for t in model.graph.initializer:
        weights[t.name] = describe(t, base_dir)
    return LoadedModel(path, base_dir, model, MappingProxyType(weights))


def describe(t: onnx.TensorProto, base_dir: str) -> WeightDescriptor:
    """A validated descriptor for one initializer; raises ExternalDataError naming tensor and file."""
    dims = tuple(int(d) for d in t.dims)
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return WeightDescriptor(t.name, t.data_type, dims, InlinePayload(t))
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location")
    if not location:
        raise ExternalDataError("external data entry has no location", tensor=t.name)
    file = resolve_location(location, base_dir, t.name)
    try:
        offset = int(info.get("offset", 0))
        size = os.path.getsize(file)
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError:
        raise ExternalDataError("external data offset/length is not an integer", tensor=t.name, file=location) from None
    if offset < 0 or length < 0:
        raise ExternalDataError("negative external data offset or length", tensor=t.name, file=location)
    if offset + length > size:
        raise ExternalDataError(
            f"offset {offset} + length {length} runs past the end of the file ({size} bytes)",
            tensor=t.name,
            file=location,
        )
    want = expected_nbytes(t.data_type, dims)
    if want is not None and want != length:
        raise ExternalDataError(
            f"length {length} does not match {onnx.TensorProto.DataType.Name(t.data_type)} x {list(dims)} "
            f"= {want} bytes",
            tensor=t.name,
            file=location,
        )
    return WeightDescriptor(t.name, t.data_type, dims, ExternalPayload(file, offset, length, info.get("checksum")))


def resolve_location(location: str, base_dir: str, tensor: str) -> str:
    """Absolute path of ``location`` if it stays inside ``base_dir`` (symlinks resolved)."""
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise ExternalDataError("external data location must be relative to the model folder",
                                tensor=tensor, file=location)
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise ExternalDataError("external data location escapes the model folder", tensor=tensor, file=location)
    real_base = os.path.realpath(base_dir)
    real = os.path.realpath(os.path.join(base_dir, location))
    if os.path.commonpath([real, real_base]) != real_base:
        raise ExternalDataError("external data location resolves outside the model folder (symlink)",
                                tensor=tensor, file=location)
    if not os.path.isfile(real):
        raise ExternalDataError("external data file is missing", tensor=tensor, file=location)
    return real
