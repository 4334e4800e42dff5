"""Prepack rules: which node inputs a kernel wants in a packed physical layout, and how to pack them.

A rule is registered next to the kernel that consumes its layout (``@prepack_rule("Gemm")``). At
resolution time the rule sees a node, its parsed attributes and the set of input positions that are
constant initializers, and returns a :class:`PrepackSpec` or None. The node is what a rule may read of
it: ``op_type``, ``domain``, ``name``, ``input`` and ``output`` (the resolver passes a view of its index,
input names as a tuple; a NodeProto works too). The spec's ``layout`` string holds
every parameter that changes the packed bytes (transB, alpha, block size, dtype ...), so two nodes
asking for the same (sources, layout) share one prepared object and two that differ get two.

The packed kernel is called as ``kernel(packed, *other_inputs)`` where ``other_inputs`` are the node's
inputs in order with the packed source positions removed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from onnx_prepared.kernels import catalog
from onnx_prepared.kernels.registry import normalize_domain
from onnx_prepared.records import record

#: Version of the packed byte formats this build writes; part of every persisted entry's identity.
KERNEL_ABI = "onnx-prepared-cpu-v1"


@record(frozen=True, slots=True)
class PrepackSpec:
    """How one node consumes a prepared object built from some of its constant inputs."""

    source_inputs: tuple[int, ...]  # node input positions folded into the packed object
    layout: str  # every parameter that changes the packed bytes
    pack: Callable[..., Any]  # (*source arrays) -> packed object with .nbytes
    kernel: Callable[..., tuple]  # (packed, *other inputs) -> outputs, attributes already bound
    to_bytes: Callable[[Any], np.ndarray] | None = None  # packed -> uint8 array (for the cache)
    from_bytes: Callable[[np.ndarray], Any] | None = None  # uint8 array -> packed
    packed_bytes: int | None = None  # size of the packed object when it differs from its sources
    #: ``kernel`` also takes a :class:`SourceForm` of the source arrays in place of the packed object, with
    #: the same outputs bit for bit: a cold run calls it so while the prepared object is not resident yet
    source_form: bool = False


class SourceForm:
    """The source arrays of a prepared object (in ``source_inputs`` order), handed to a kernel whose spec
    has ``source_form`` instead of the packed object it has not been given yet."""

    __slots__ = ("arrays",)

    def __init__(self, arrays: tuple) -> None:
        self.arrays = arrays


PrepackRule = Callable[[Any, dict, frozenset[int], dict[int, tuple]], "PrepackSpec | None"]
RULES: dict[tuple[str, str], list[PrepackRule]] = {}


def prepack_rule(op_type: str, *, domain: str = ""):
    """Register ``fn(node, attrs, const_inputs, const_shapes) -> PrepackSpec | None`` for an op."""

    def register(fn: PrepackRule) -> PrepackRule:
        RULES.setdefault((normalize_domain(domain), op_type), []).append(fn)
        return fn

    return register


def match(node: Any, attrs: dict, const_inputs: frozenset[int], const_shapes: dict[int, tuple]) -> PrepackSpec | None:
    """The first rule's spec for ``node``, or None when it runs unpacked."""
    key = (normalize_domain(node.domain), node.op_type)
    catalog.ensure_loaded(*key)
    for rule in RULES.get(key, ()):
        spec = rule(node, attrs, const_inputs, const_shapes)
        if spec is not None:
            return spec
    return None


def array_to_bytes(a: np.ndarray) -> np.ndarray:
    """A packed ndarray as its raw bytes (shape and dtype live in the layout key)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
