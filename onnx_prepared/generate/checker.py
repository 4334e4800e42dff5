"""``onnx.checker`` for genai-layout models.

onnxruntime registers ``SimplifiedLayerNormalization`` in the *default* ONNX domain (since 1), and
genai exports use it there; ONNX itself has no such op, so plain ``onnx.checker.check_model`` fails
with "No Op registered for SimplifiedLayerNormalization" on every genai model. Moving the op to
``com.microsoft`` is not an option: onnxruntime does not register it there. :func:`check_model`
therefore registers onnxruntime's schema for the duration of the check and removes it afterwards, so
the rest of the process sees onnx's registry unchanged. ``com.microsoft`` ops are skipped by the
checker as usual (custom domain).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import onnx
from onnx import helper
from onnx.defs import OpSchema

_lock = threading.Lock()


def _simplified_layer_norm_schema() -> OpSchema:
    # Mirrors onnxruntime's contrib schema (domain "", since_version 1).
    fp = OpSchema.FormalParameter
    floats = ["tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"]
    return OpSchema(
        "SimplifiedLayerNormalization", "", 1,
        "onnxruntime contrib op: RMS normalization over the last axes (registered for checking only).",
        inputs=[fp("X", "T"), fp("scale", "V")],
        outputs=[fp("Y", "V"), fp("inv_std_var", "U", param_option=OpSchema.FormalParameterOption.Optional)],
        type_constraints=[("T", floats, ""), ("U", ["tensor(float)", "tensor(double)"], ""), ("V", floats, "")],
        attributes=[OpSchema.Attribute(name, helper.make_attribute(name, value))
                    for name, value in (("axis", -1), ("epsilon", 1e-5), ("stash_type", 1))],
    )


@contextlib.contextmanager
def ort_default_domain_schemas() -> Iterator[None]:
    """Temporarily teach onnx's schema registry onnxruntime's default-domain contrib ops."""
    with _lock:
        known = onnx.defs.has("SimplifiedLayerNormalization", "")
        if not known:
            onnx.defs.register_schema(_simplified_layer_norm_schema())
        try:
            yield
        finally:
            if not known:
                onnx.defs.deregister_schema("SimplifiedLayerNormalization", 1, "")


def check_model(path: str | os.PathLike, *, full_check: bool = False) -> None:
    """``onnx.checker.check_model(path)`` accepting genai's default-domain SimplifiedLayerNormalization.

    Passing the path (not a proto) lets the checker validate external-data locations.
    """
    with ort_default_domain_schemas():
        onnx.checker.check_model(os.fspath(path), full_check=full_check)
