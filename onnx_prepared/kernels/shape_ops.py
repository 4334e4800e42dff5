"""Shape and indexing ops: mostly metadata changes that return numpy views, never copies of data.

Outputs may be views of inputs (Reshape, Transpose, Slice, Split, Squeeze, Identity-like ops); that is
safe because no kernel writes into its inputs. Shape-like inputs (shapes, axes, starts, repeats)
arrive as int64/int32 arrays and are turned into Python ints once per call with ``tolist()``.
Versions where an attribute became an input are registered separately (Slice 1/10, Split 2/13/18,
Squeeze/Unsqueeze 1/13, Shape 1/15).
"""

from __future__ import annotations

import math

import numpy as np

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.kernels.registry import kernel, specializes


def _ints(v: np.ndarray | list | None) -> list[int]:
    if v is None:
        return []
    if type(v) is np.ndarray and v.dtype.kind in "iu":
        return v.ravel().tolist()  # already Python ints
    return [int(i) for i in (v.ravel().tolist() if isinstance(v, np.ndarray) else v)]


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


# **** Reshape, Flatten, Squeeze, Unsqueeze ****


def _below_minus_one(dims) -> bool:
    """Whether a Reshape target has a dim below -1, an error (numpy would infer it as -1 does: a mutated
    exported GRU's ``[0, 0, -2359297]`` ran as ``[0, 0, -1]``; onnxruntime refuses it). ReshapeFromShape
    needs no check: its fusion leaves such a constant to a plain Reshape, and its copied dims are shape dims."""
    return bool(dims) and min(dims) < -1


def _check_target(dims) -> None:
    if _below_minus_one(dims):
        raise ValueError(f"Reshape target shape {list(dims)} has a dimension below -1")


@kernel("Reshape", since=5)
def reshape(x: np.ndarray, shape: np.ndarray, *, allowzero: int = 0) -> tuple[np.ndarray]:
    """``0`` copies the input dim (unless ``allowzero``), ``-1`` is inferred; below -1 is an error."""
    dims = _ints(shape)
    _check_target(dims)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return (x.reshape(dims),)


@kernel("ReshapeFromShape", since=1, domain="onnx_prepared")
def reshape_from_shape(x: np.ndarray, s: np.ndarray, *, index: list[int], copied: list[int], values: list[int],
                       allowzero: int = 0) -> tuple[np.ndarray]:
    """Reshape(x, shape) with ``shape[j] = s.shape[index[j]]`` where ``copied[j]`` else ``values[j]``: the
    Shape / Gather / Unsqueeze / Concat chain that exporters write to build a target shape
    (resolve/fusions.py), evaluated as that chain evaluates it (a bad index raises as Gather would)."""
    dims = s.shape
    target = [dims[i] if c else v for i, c, v in zip(index, copied, values)]
    if not allowzero:
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return (x.reshape(target),)


@specializes(reshape)
def _reshape_const(consts: dict, n_inputs: int, *, allowzero: int = 0):
    """A constant target shape: its ints once; with no ``0`` to copy (or ``allowzero``) the call is one
    ``reshape``, else the copied dims are filled in once per input shape."""
    if 1 not in consts or consts[1] is None:
        return None
    dims = tuple(_ints(consts[1]))
    if _below_minus_one(dims):
        return None  # the kernel raises, naming the target
    if allowzero or 0 not in dims:

        def reshape_const(x: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray]:
            return (x.reshape(dims),)

        return reshape_const
    shapes: dict[tuple, tuple] = {}

    def reshape_copying(x: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray]:
        target = shapes.get(x.shape)
        if target is None:
            target = tuple(x.shape[i] if d == 0 else d for i, d in enumerate(dims))
            if len(shapes) < 64:
                shapes[x.shape] = target
        return (x.reshape(target),)

    return reshape_copying


@kernel("Flatten", since=1)
def flatten(x: np.ndarray, *, axis: int = 1) -> tuple[np.ndarray]:
    axis = axis + x.ndim if axis < 0 else axis
    return (x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])),)


def _flatten_batch(x: np.ndarray) -> tuple[np.ndarray]:
    """Flatten with axis 1 (a CNN's head): ``reshape(N, -1)`` without the two products (1.5 -> 0.7 us);
    an empty batch (-1 is ambiguous there) and scalars take the kernel."""
    if x.ndim and x.shape[0]:
        return (x.reshape(x.shape[0], -1),)
    return flatten(x, axis=1)


@specializes(flatten)
def _flatten_bound(consts: dict, n_inputs: int, *, axis: int = 1):
    return _flatten_batch if axis == 1 else None


def _squeeze(x: np.ndarray, axes: list[int]) -> np.ndarray:
    if not axes:
        return x.reshape([d for d in x.shape if d != 1])
    return np.squeeze(x, axis=tuple(axes))


@kernel("Squeeze", since=1)
def squeeze_1(x: np.ndarray, *, axes: list[int] | None = None) -> tuple[np.ndarray]:
    return (_squeeze(x, _ints(axes)),)


@kernel("Squeeze", since=13)
def squeeze_13(x: np.ndarray, axes: np.ndarray | None = None) -> tuple[np.ndarray]:
    return (_squeeze(x, _ints(axes)),)


def _unsqueeze(x: np.ndarray, axes: list[int]) -> np.ndarray:
    rank = x.ndim + len(axes)
    inserted = sorted(_axis(a, rank) for a in axes)
    if len(set(inserted)) != len(inserted):
        raise ValueError(f"Unsqueeze axes {axes} contain duplicates")
    dims = list(x.shape)
    for a in inserted:
        dims.insert(a, 1)
    return x.reshape(dims)


@specializes(squeeze_13)
def _squeeze_const(consts: dict, n_inputs: int):
    if n_inputs < 2 or 1 not in consts or consts[1] is None:
        return None
    axes = tuple(_ints(consts[1]))
    if not axes:
        return None

    shapes: dict[tuple, tuple] = {}

    def squeeze_const(x: np.ndarray, axes_: np.ndarray | None = None) -> tuple[np.ndarray]:
        dims = shapes.get(x.shape)
        if dims is None:  # np.squeeze checks the axes once per input shape; then a reshape (~4x faster)
            dims = shapes[x.shape] = np.squeeze(x, axis=axes).shape
        return (x.reshape(dims),)

    return squeeze_const


@kernel("Unsqueeze", since=1)
def unsqueeze_1(x: np.ndarray, *, axes: list[int] | None = None) -> tuple[np.ndarray]:
    return (_unsqueeze(x, _ints(axes)),)


@kernel("Unsqueeze", since=13)
def unsqueeze_13(x: np.ndarray, axes: np.ndarray) -> tuple[np.ndarray]:
    return (_unsqueeze(x, _ints(axes)),)


@specializes(unsqueeze_13)
def _unsqueeze_const(consts: dict, n_inputs: int):
    """Constant axes: the output shape once per input shape."""
    if 1 not in consts or consts[1] is None:
        return None
    axes = _ints(consts[1])
    shapes: dict[tuple, tuple] = {}

    def unsqueeze_const(x: np.ndarray, axes_: np.ndarray) -> tuple[np.ndarray]:
        dims = shapes.get(x.shape)
        if dims is None:
            dims = _unsqueeze(x, axes).shape
            if len(shapes) < 64:
                shapes[x.shape] = dims
        return (x.reshape(dims),)

    return unsqueeze_const


# **** Transpose, Expand, Tile ****


@kernel("Transpose", since=1)
def transpose(x: np.ndarray, *, perm: list[int] | None = None) -> tuple[np.ndarray]:
    """A strided view; the consumer decides whether it needs a contiguous copy. (The method, not
    ``np.transpose``, whose Python wrapper costs about a microsecond a call.)"""
    return (x.transpose(perm) if perm is not None else x.transpose(),)


@kernel("Expand", since=8)
def expand(x: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray]:
    """Bidirectional broadcast; the result is materialized, so it is writable and owns its data."""
    out_shape = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    y = np.empty(out_shape, dtype=x.dtype)
    y[...] = x
    return (y,)


@kernel("Tile", since=6)
def tile(x: np.ndarray, repeats: np.ndarray) -> tuple[np.ndarray]:
    reps = _ints(repeats)
    if len(reps) != x.ndim:
        raise ValueError(f"Tile repeats has {len(reps)} entries for an input of rank {x.ndim}")
    return (np.tile(x, reps) if x.ndim else x.copy(),)


@kernel("Trilu", since=14)
def trilu(x: np.ndarray, k: np.ndarray | None = None, *, upper: int = 1) -> tuple[np.ndarray]:
    """Keep the upper (or lower) triangle of the last two dims, offset by diagonal ``k``."""
    diagonal = 0 if k is None else int(k.item())
    return (np.triu(x, diagonal) if upper else np.tril(x, diagonal),)


# **** Gather, Concat, Split, Slice ****


@kernel("Gather", since=1)
def gather(x: np.ndarray, indices: np.ndarray, *, axis: int = 0) -> tuple[np.ndarray]:
    """Negative indices count from the end (opset 11+; accepted at every version)."""
    axis = _axis(axis, x.ndim)
    if indices.ndim == 0 and axis == 0:
        return (np.asarray(x[int(indices)]),)  # one row: a view, no gather
    return (np.asarray(np.take(x, indices, axis=axis)),)


@kernel("Concat", since=4)
def concat(*inputs: np.ndarray, axis: int) -> tuple[np.ndarray]:
    return (np.concatenate(inputs, axis=axis),)


@specializes(concat)
def _concat_bound(consts: dict, n_inputs: int, *, axis: int | None = None):
    """Concat with its axis bound: a closure instead of ``functools.partial`` with the axis keyword, two
    inputs (a U-Net's skip join, a head's pooled pair) without the ``*inputs`` packing (~0.5 us a call)."""
    if axis is None:
        return None  # the kernel reports the missing attribute
    cat = np.concatenate
    if n_inputs == 2:

        def concat_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
            return (cat((a, b), axis),)

        return concat_pair

    def concat_bound(*inputs: np.ndarray) -> tuple[np.ndarray]:
        return (cat(inputs, axis),)

    return concat_bound


def _split_sizes(sizes: list[int], dim: int, axis: int, n: int) -> list[int]:
    if not sizes:
        chunk = -(-dim // n) if n else 0
        sizes = [chunk] * n
        if n:
            sizes[-1] = dim - chunk * (n - 1)
    if sum(sizes) != dim or any(s < 0 for s in sizes):
        raise ValueError(f"Split sizes {sizes} do not add up to dimension {dim} of axis {axis}")
    return sizes


def _split_index(rank: int, sizes: list[int], axis: int) -> tuple[tuple, ...]:
    """One basic index per output: the outputs are views, as numpy's split makes them (without its
    per-call cumsum and array_split machinery, ~30 us on three outputs)."""
    lead = (slice(None),) * axis
    out, start = [], 0
    for size in sizes:
        out.append((*lead, slice(start, start + size)))
        start += size
    return tuple(out)


def _split(x: np.ndarray, sizes: list[int], axis: int, n: int) -> tuple[np.ndarray, ...]:
    axis = _axis(axis, x.ndim)
    sizes = _split_sizes(sizes, x.shape[axis], axis, n)
    return tuple(x[i] for i in _split_index(x.ndim, sizes, axis))


@kernel("Split", since=2)
def split_2(x: np.ndarray, *, axis: int = 0, split: list[int] | None = None, n_outputs: int = 1) -> tuple:
    return _split(x, _ints(split), axis, n_outputs)


@kernel("Split", since=13)
def split_13(x: np.ndarray, split: np.ndarray | None = None, *, axis: int = 0, n_outputs: int = 1) -> tuple:
    return _split(x, _ints(split), axis, n_outputs)


@specializes(split_13)
def _split_const(consts: dict, n_inputs: int, *, axis: int = 0, n_outputs: int = 1):
    """Constant (or omitted) sizes: the output indices once per input shape."""
    if n_inputs >= 2 and 1 not in consts:
        return None
    sizes = _ints(consts.get(1))
    cache: dict[tuple, tuple] = {}

    def split_const(x: np.ndarray, split: np.ndarray | None = None) -> tuple:
        index = cache.get(x.shape)
        if index is None:
            a = _axis(axis, x.ndim)
            index = cache[x.shape] = _split_index(x.ndim, _split_sizes(sizes, x.shape[a], a, n_outputs), a)
        return tuple(x[i] for i in index)

    return split_const


@kernel("Split", since=18)
def split_18(
    x: np.ndarray,
    split: np.ndarray | None = None,
    *,
    axis: int = 0,
    num_outputs: int | None = None,
    n_outputs: int = 1,
) -> tuple:
    """``num_outputs`` splits into equal chunks of ``ceil(dim / n)`` with a smaller last chunk."""
    return _split(x, _ints(split), axis, num_outputs or n_outputs)


def _slice(x: np.ndarray, starts: list[int], ends: list[int], axes: list[int], steps: list[int]) -> np.ndarray:
    return x[_slice_index(x, starts, ends, axes, steps)]


def _slice_index(x: np.ndarray, starts: list[int], ends: list[int], axes: list[int], steps: list[int]) -> tuple:
    """Python slicing already clamps like ONNX (negative values count from the end) with one exception:
    a negative step whose start lies before ``-dim``, which ONNX clamps to 0 (element 0 included) and
    Python to "before 0" (nothing)."""
    if len(starts) != len(ends):
        raise ValueError(f"Slice has {len(starts)} starts but {len(ends)} ends")
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, x.ndim)
        if step < 0 and start < -x.shape[axis]:
            start = 0
        index[axis] = slice(start, end, step)
    return tuple(index)


@kernel("Slice", since=1)
def slice_1(x: np.ndarray, *, starts: list[int], ends: list[int], axes: list[int] | None = None) -> tuple[np.ndarray]:
    """Attribute form (opset 1-9): no steps."""
    return (_slice(x, _ints(starts), _ints(ends), _ints(axes), []),)


@kernel("Slice", since=10)
def slice_10(
    x: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> tuple[np.ndarray]:
    params = (starts, ends, axes, steps)
    if all(p is None or (type(p) is np.ndarray and not p.flags.writeable) for p in params):
        # constant parameters (initializers, folded Constants are read-only): the index once per shape
        key = (x.shape, *map(id, params))
        hit = _SLICES.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], params)):
            return (x[hit[1]],)
        index = _slice_index(x, _ints(starts), _ints(ends), _ints(axes), _ints(steps))
        if len(_SLICES) >= 512:
            _SLICES.clear()
        _SLICES[key] = (params, index)  # holds the parameters: their ids stay theirs
        return (x[index],)
    return (_slice(x, _ints(starts), _ints(ends), _ints(axes), _ints(steps)),)


@specializes(slice_10)
def _slice_const(consts: dict, n_inputs: int):
    """Constant starts/ends/axes/steps (folded Constant nodes): their ints once, the index once per
    input shape."""
    if n_inputs < 3 or not all(i in consts for i in range(1, n_inputs)) or consts[1] is None or consts[2] is None:
        return None
    params = [_ints(consts.get(i)) for i in range(1, 5)]
    indices: dict[tuple, tuple] = {}

    def slice_const(x: np.ndarray, *_: np.ndarray | None) -> tuple[np.ndarray]:
        index = indices.get(x.shape)
        if index is None:
            index = _slice_index(x, *params)
            if len(indices) < 64:
                indices[x.shape] = index
        return (x[index],)

    return slice_const


#: (input shape, ids of starts/ends/axes/steps) -> (those arrays, the index tuple) for read-only parameters
_SLICES: dict[tuple, tuple] = {}


# **** Shape, Size, Where, Range ****


@kernel("Shape", since=1)
def shape(x: np.ndarray, *, start: int = 0, end: int | None = None) -> tuple[np.ndarray]:
    """``start``/``end`` (opset 15) clamp like Python slicing, which they match."""
    return (np.array(x.shape[start:end], dtype=np.int64),)


@kernel("Size", since=1)
def size(x: np.ndarray) -> tuple[np.ndarray]:
    return (np.array(x.size, dtype=np.int64),)


@kernel("Where", since=9)
def where(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (np.asarray(np.where(cond, a, b)),)


@kernel("Range", since=11)
def range_(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray]:
    """``ceil((limit - start) / delta)`` elements ``start + i * delta``, in the inputs' dtype."""
    dtype = start.dtype
    if dtype.kind in "iu":
        return (np.arange(start.item(), limit.item(), delta.item(), dtype=dtype),)
    return (np.arange(start.item(), limit.item(), delta.item()).astype(dtype),)


@kernel("Range", since=27)
def range_27(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, *, stash_type: int = 1) -> tuple[np.ndarray]:
    """``stash_type`` (float or double) is the compute type for float16/bfloat16 inputs."""
    if start.dtype.name not in ("float16", "bfloat16"):
        return range_(start, limit, delta)
    work = np.float64 if stash_type == onnx.TensorProto.DOUBLE else np.float32
    values = [work(v.item()) for v in (start, limit, delta)]
    return (np.arange(*values, dtype=work).astype(start.dtype),)


# **** Constant, ConstantOfShape ****


def _dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    values = onnx.to_array(sp.values)
    indices = onnx.to_array(sp.indices).astype(np.int64)
    dims = tuple(sp.dims)
    out = np.zeros(math.prod(dims), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)
    out[flat] = values
    return out.reshape(dims)


@kernel("Constant", since=1)
def constant(
    *,
    value: np.ndarray | None = None,
    sparse_value: onnx.SparseTensorProto | None = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
    value_string: str | None = None,
    value_strings: list[str] | None = None,
) -> tuple[np.ndarray]:
    """Exactly one ``value*`` attribute is set; the binder fixes it at plan time."""
    if value is not None:
        return (value,)
    if sparse_value is not None:
        return (_dense(sparse_value),)
    if value_float is not None:
        return (np.array(value_float, dtype=np.float32),)
    if value_floats is not None:
        return (np.array(value_floats, dtype=np.float32),)
    if value_int is not None:
        return (np.array(value_int, dtype=np.int64),)
    if value_ints is not None:
        return (np.array(value_ints, dtype=np.int64),)
    if value_string is not None:
        return (np.array(value_string, dtype=object),)
    if value_strings is not None:
        return (np.array(value_strings, dtype=object),)
    raise ValueError("Constant node sets none of the value attributes")


@kernel("ConstantOfShape", since=9)
def constant_of_shape(shape: np.ndarray, *, value: np.ndarray | None = None) -> tuple[np.ndarray]:
    if value is None:
        return (np.zeros(_ints(shape), dtype=np.float32),)
    if value.size != 1:
        raise ValueError(f"ConstantOfShape value must have one element, got shape {value.shape}")
    return (np.full(_ints(shape), value.reshape(()), dtype=value.dtype),)
