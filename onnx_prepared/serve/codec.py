"""Tensors over HTTP: a JSON body for small requests, an ``.npz`` body for large ones.

JSON request ``{"inputs": {"x": [[1, 2]], "ids": {"data": [1, 2], "shape": [1, 2], "dtype": "int64"}}}``: a
plain nested list takes the model input's element type; the object form names shape and dtype. The
response is ``{"outputs": {"y": {"dtype": "float32", "shape": [1, 2], "data": [...]}}}``. An
``application/x-npz`` request (``np.savez`` of the feeds) gets an ``.npz`` response; floats travel
bit-exact that way, JSON floats through ``repr`` (also exact for float32 once parsed back into float32).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_prepared.errors import InvalidFeedError

NPZ = "application/x-npz"
JSON = "application/json"

#: ONNX type strings (``tensor(float)``) -> numpy dtypes, for JSON lists without a dtype.
_TYPES = {"float": np.float32, "float16": np.float16, "double": np.float64, "int64": np.int64, "int32": np.int32,
          "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
          "uint64": np.uint64, "bool": np.bool_}

#: Bounds on what a request may ask this process to decode (a body is already bounded by the proxy).
MAX_ELEMENTS = 1 << 28


def dtype_of(type_string: str) -> np.dtype | None:
    """numpy dtype of an ONNX type string (``tensor(float)`` -> float32); None when not a plain tensor."""
    if not type_string.startswith("tensor(") or not type_string.endswith(")"):
        return None
    t = _TYPES.get(type_string[len("tensor("):-1])
    return None if t is None else np.dtype(t)


def decode_json(body: bytes | str | Mapping[str, Any], dtypes: Mapping[str, np.dtype | None]) -> dict[str, np.ndarray]:
    """Feeds from a JSON request; ``dtypes`` maps each model input to its element type (None: from data)."""
    try:
        doc = json.loads(body) if isinstance(body, (bytes, str)) else body
    except ValueError as e:
        raise InvalidFeedError(f"request body is not JSON: {e}") from None
    inputs = doc.get("inputs") if isinstance(doc, Mapping) else None
    if not isinstance(inputs, Mapping):
        raise InvalidFeedError('request body must be {"inputs": {name: value}}')
    feeds = {}
    for name, value in inputs.items():
        if name not in dtypes:
            raise InvalidFeedError(f"unknown input {name!r}; the model's inputs are {sorted(dtypes)}")
        feeds[name] = _tensor(name, value, dtypes[name])
    return feeds


def _tensor(name: str, value: Any, want: np.dtype | None) -> np.ndarray:
    shape = None
    if isinstance(value, Mapping):
        if "data" not in value:
            raise InvalidFeedError(f"input {name!r}: an object value needs 'data' (and optional 'shape', 'dtype')")
        shape, dt = value.get("shape"), value.get("dtype")
        if dt is not None:
            try:
                want = np.dtype(dt)
            except TypeError:
                raise InvalidFeedError(f"input {name!r}: unknown dtype {dt!r}") from None
        value = value["data"]
    try:
        arr = np.asarray(value, dtype=want)
    except (ValueError, TypeError) as e:
        raise InvalidFeedError(f"input {name!r}: cannot make a {want or 'numeric'} tensor of the data: {e}") from None
    if arr.dtype == object:
        raise InvalidFeedError(f"input {name!r}: ragged or non-numeric data")
    if arr.size > MAX_ELEMENTS:
        raise InvalidFeedError(f"input {name!r}: {arr.size} elements exceed the limit of {MAX_ELEMENTS}")
    if shape is not None:
        try:
            arr = arr.reshape([int(d) for d in shape])
        except (ValueError, TypeError) as e:
            raise InvalidFeedError(f"input {name!r}: data does not fit shape {shape!r}: {e}") from None
    return arr


def encode_json(outputs: Mapping[str, np.ndarray]) -> bytes:
    return json.dumps({"outputs": {n: {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.tolist()}
                                   for n, a in ((n, np.asarray(v)) for n, v in outputs.items())}}).encode()


def outputs_from_json(body: bytes | str | Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The client side of :func:`encode_json`: output name -> array with its dtype and shape."""
    doc = json.loads(body) if isinstance(body, (bytes, str)) else body
    return {n: np.asarray(v["data"], dtype=v["dtype"]).reshape(v["shape"]) for n, v in doc["outputs"].items()}


def decode_npz(body: bytes) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as z:
            return {n: z[n] for n in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise InvalidFeedError(f"request body is not an .npz archive: {e}") from None


def encode_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{n: np.asarray(a) for n, a in arrays.items()})
    return buf.getvalue()
