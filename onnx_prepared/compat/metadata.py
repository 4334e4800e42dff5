"""Output shapes as onnxruntime reports them: the declared shape merged with ONNX shape inference.

onnxruntime resolves the graph and merges each inferred output shape into the declared one, dim by dim:
an inferred value fills a dim that has no value (even a symbolic one), a declared value or name is kept
otherwise, an inferred name fills a dim that has neither, and a negative declared value counts as unknown.
Names onnx's inference invents for unknown dims (``unk__N``) are unknown (None) to onnxruntime, whose
inference does not invent them. Inputs keep their declared shapes.
"""

from __future__ import annotations

import re

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.runtime.feeds import shape_of

#: initializers larger than this enter inference as typed graph inputs (their values only matter to
#: data propagation of small shape tensors), so inference never copies weight bytes.
_SMALL_INITIALIZER = 4096

_INVENTED = re.compile(r"unk__\d+")


def output_shapes(model: onnx.ModelProto) -> list[list]:
    """Each graph output's shape list (ints, names, None), declared merged with inferred."""
    declared = [shape_of(o.type) for o in model.graph.output]
    try:
        inferred = _inferred(model)
    except Exception:  # inference is best effort: a model it cannot follow keeps its declared shapes
        return declared
    out = []
    for o, dec in zip(model.graph.output, declared):
        tp = inferred.get(o.name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            out.append(dec)
            continue
        inf = [_dim(d) for d in tp.tensor_type.shape.dim]
        if not o.type.tensor_type.HasField("shape"):
            out.append(inf)
        elif len(inf) != len(dec):
            out.append(dec)
        else:
            out.append([_merge(d, i) for d, i in zip(dec, inf)])
    return out


def _dim(d: onnx.TensorShapeProto.Dimension):
    if d.HasField("dim_value"):
        return d.dim_value if d.dim_value >= 0 else None
    if d.dim_param and not _INVENTED.fullmatch(d.dim_param):
        return d.dim_param
    return None


def _merge(declared, inferred):
    if isinstance(inferred, int) and not isinstance(declared, int):
        return inferred
    if declared is not None:
        return declared
    return inferred


def _inferred(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    src = model.graph
    g = light.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(onnx.ValueInfoProto(name=o.name) for o in src.output)
    g.value_info.extend(src.value_info)
    declared_inputs = {i.name for i in src.input}
    for t in src.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and onnx.tensor_dtype_to_np_dtype(t.data_type).itemsize \
                * max(1, _numel(t)) <= _SMALL_INITIALIZER:
            g.initializer.append(t)
        elif t.name not in declared_inputs:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    g.sparse_initializer.extend(src.sparse_initializer)
    if light.ir_version < 4:
        light.ir_version = 4  # initializers as extra inputs need IR 4
    done = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
    return {o.name: o.type for o in done.graph.output}


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n
