"""Validation of external-data entries, done at load time before anything can read them.

An entry is accepted only if its ``location`` resolves inside the model's folder (no absolute path,
no ``..`` component, no symlink leading outside; a symlink inside the folder to a file inside is fine),
names a regular file, ``offset``/``length`` are non-negative decimal integers, ``offset + length`` lies
within the file and ``length`` equals the tensor's stored size (packed for sub-byte types; an absent
``length`` means "to the end of the file" and must match too). Checks use ``stat``/``realpath`` only:
no data file is opened here.
"""

from __future__ import annotations

import os
import stat

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.errors import ExternalDataError, short
from onnx_prepared.model.descriptors import ExternalPayload, elem_type_name, expected_nbytes
from onnx_prepared.model.safe_open import fingerprint

#: offset/length are byte positions in a file: 20 digits already exceed 2**64.
_MAX_DIGITS = 20


def _is_absolute(location: str) -> bool:
    # Windows forms too: a model written on Windows must not reach C:\ or \\server\share here either.
    return (os.path.isabs(location) or location.startswith(("/", "\\"))
            or (len(location) > 1 and location[1] == ":"))


class LocationResolver:
    """Resolves and stats each distinct ``location`` once per model (thousands of tensors share a file).

    Not thread-safe; one instance per ``load_model`` call.
    """

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self._real_base: str | None = None  # realpath on the first external location (most models have none)
        self._ok: dict[str, tuple[str, int, str]] = {}  # location -> (real path, size, fingerprint)

    def resolve(self, location: str, tensor: str) -> tuple[str, int, str]:
        """(absolute real path, file size, stat fingerprint) of ``location``; raises ExternalDataError
        naming ``tensor``."""
        hit = self._ok.get(location)
        if hit is not None:
            return hit
        if "\0" in location:
            raise ExternalDataError("external data location contains a NUL byte", tensor=tensor, file=location)
        if _is_absolute(location):
            raise ExternalDataError("external data location must be relative to the model folder",
                                    tensor=tensor, file=location)
        if ".." in location.replace("\\", "/").split("/"):
            raise ExternalDataError("external data location escapes the model folder ('..')",
                                    tensor=tensor, file=location)
        try:
            real = os.path.realpath(os.path.join(self.base_dir, location))
            if self._real_base is None:
                self._real_base = os.path.realpath(self.base_dir)
            inside = os.path.commonpath([real, self._real_base]) == self._real_base
        except (OSError, ValueError) as e:
            raise ExternalDataError(f"cannot resolve external data location: {e}", tensor=tensor,
                                    file=location) from None
        if not inside:
            raise ExternalDataError("external data location resolves outside the model folder (symlink)",
                                    tensor=tensor, file=location)
        try:
            st = os.stat(real)
        except FileNotFoundError:
            raise ExternalDataError("external data file is missing", tensor=tensor, file=location) from None
        except OSError as e:
            raise ExternalDataError(f"cannot stat external data file: {e.strerror}", tensor=tensor,
                                    file=location) from None
        if not stat.S_ISREG(st.st_mode):
            raise ExternalDataError("external data location is not a regular file", tensor=tensor, file=location)
        self._ok[location] = hit = (real, st.st_size, fingerprint(st))
        return hit


def _parse_uint(value: str, key: str, tensor: str, location: str) -> int:
    # Strict: int() would also take " 12", "1_000" and "+3", which no producer writes.
    if not (value.isascii() and value.isdigit()):
        raise ExternalDataError(f"external data {key} {short(value, 40)!r} is not a non-negative integer",
                                tensor=tensor, file=location)
    if len(value) > _MAX_DIGITS:  # also keeps int() below Python's 4300-digit conversion limit
        raise ExternalDataError(f"external data {key} has {len(value)} digits: larger than any file "
                                f"({short(value, 40)})", tensor=tensor, file=location)
    return int(value)


#: The external-data keys onnxruntime accepts; it refuses the model on any other. Ignoring one would be
#: worse: a byte flip turning "offset" into "offsRt" made us read the tensor from offset 0.
_KEYS = ("location", "offset", "length", "checksum")


def external_payload(t: onnx.TensorProto, resolver: LocationResolver, name: str | None = None, *,
                     data_type: int | None = None, dims: tuple[int, ...] | None = None) -> ExternalPayload:
    """The validated payload of external tensor ``t``; raises ExternalDataError naming tensor and file.

    ``name`` replaces ``t.name`` in messages (nested tensors are often unnamed); ``data_type`` and
    ``dims`` are ``t``'s when the caller read them already (each protobuf field read builds objects).
    """
    name = name or t.name
    info: dict[str, str] = {}
    for e in t.external_data:
        key, value = e.key, e.value
        if key.__class__ is not str or value.__class__ is not str:  # protobuf hands back invalid UTF-8 as bytes
            raise ExternalDataError(f"external data entry {short(repr(key), 60)} is not valid UTF-8", tensor=name)
        if key not in _KEYS:
            raise ExternalDataError(f"unknown external data key {short(key, 60)!r} (known: {', '.join(_KEYS)})",
                                    tensor=name)
        info[key] = value
    location = info.get("location", "")
    if not location:
        raise ExternalDataError("external data entry has no location", tensor=name)
    if dims is None:
        dims = tuple(t.dims)
    if data_type is None:
        data_type = t.data_type
    try:
        want = expected_nbytes(data_type, dims)
    except ValueError as e:
        raise ExternalDataError(f"external tensor has an invalid element type: {e}", tensor=name,
                                file=location) from None
    if want is None:
        raise ExternalDataError("STRING tensors cannot be stored as external data", tensor=name, file=location)
    if any(d < 0 for d in dims):
        raise ExternalDataError(f"negative dimension in {short(list(dims))}", tensor=name, file=location)
    file, size, fp = resolver.resolve(location, name)
    offset = _parse_uint(info["offset"], "offset", name, location) if "offset" in info else 0
    if offset > size:
        raise ExternalDataError(f"offset {offset} lies past the end of the file ({size} bytes)",
                                tensor=name, file=location)
    length = _parse_uint(info["length"], "length", name, location) if "length" in info else size - offset
    if offset + length > size:
        raise ExternalDataError(f"offset {offset} + length {length} runs past the end of the file ({size} bytes)",
                                tensor=name, file=location)
    if length != want:
        raise ExternalDataError(
            f"length {length} does not match {elem_type_name(data_type)} x {list(dims)} = {want} bytes",
            tensor=name,
            file=location,
        )
    return ExternalPayload(file, offset, length, info.get("checksum") or None, fp)
