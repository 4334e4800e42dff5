"""One kernel table keyed by (domain, op_type), versions explicit.

A kernel is a plain module-level function: inputs are positional ndarrays (``None`` for an omitted
optional input), ONNX attributes arrive as keyword-only arguments with their defaults spelled out in
the signature, and it returns a tuple of arrays. A kernel knows nothing about nodes or sessions.

Register with ``@kernel("Gemm", since=13)`` and list the op in :mod:`onnx_prepared.kernels.catalog`
(which imports a kernel module when a model first uses one of its ops); :func:`lookup` picks the
highest ``since`` <= the model's opset (and < ``until`` when given). Ops without a fast kernel go
through the named, counted ``onnx.reference`` fallback in :mod:`onnx_prepared.bind.reference`.

A kernel that needs the node's output count declares a keyword-only ``n_outputs`` parameter; the
binder passes it (Split-13 splits evenly by the number of outputs, for example).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

from onnx_prepared.kernels import catalog
from onnx_prepared.records import field, record

KernelFn = Callable[..., tuple]

#: Domain spellings that mean the default ONNX domain.
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})


def normalize_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


@record(frozen=True, slots=True)
class KernelSpec:
    """One registered implementation, valid for opsets in [since, until)."""

    domain: str
    op_type: str
    since: int
    until: int | None
    fn: KernelFn
    #: keyword parameters the function accepts (attributes it understands)
    params: frozenset[str]
    #: True when the function accepts ``**kwargs`` (any attribute)
    var_kwargs: bool
    wants_n_outputs: bool
    #: "domain::op_type-since", the name a binding reports (derived once: every bound node asks)
    name: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"{self.domain or 'ai.onnx'}::{self.op_type}-{self.since}")


REGISTRY: dict[tuple[str, str], dict[int, KernelSpec]] = {}


def kernel(op_type: str, since: int = 1, *, domain: str = "", until: int | None = None):
    """Register ``fn`` as the fast kernel for ``op_type`` from opset ``since`` on."""

    def register(fn: KernelFn) -> KernelFn:
        params, var_kwargs = keyword_params(fn)
        dom = normalize_domain(domain)
        spec = KernelSpec(dom, op_type, since, until, fn, params, var_kwargs, "n_outputs" in params)
        REGISTRY.setdefault((dom, op_type), {})[since] = spec
        _LOOKUPS.clear()
        return fn

    return register


def keyword_params(fn: Callable) -> tuple[frozenset[str], bool]:
    """(the parameters ``fn`` takes by keyword, whether it takes ``**kwargs``): from the code object of a
    plain function (``inspect.signature`` cost ~50-70 us a kernel, paid by the first session of every
    process), through ``inspect`` for anything else (wrapped, partial, builtin, ``__signature__``)."""
    code = getattr(fn, "__code__", None)
    if type(fn) is types.FunctionType and not hasattr(fn, "__wrapped__") and not hasattr(fn, "__signature__"):
        names = code.co_varnames[code.co_posonlyargcount:code.co_argcount + code.co_kwonlyargcount]
        return frozenset(names), bool(code.co_flags & inspect.CO_VARKEYWORDS)
    sig = inspect.signature(fn)
    params = frozenset(n for n, p in sig.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    return params, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def lookup(domain: str, op_type: str, opset: int) -> KernelSpec | None:
    """The fast kernel for ``op_type`` at ``opset``, or None when only the fallback applies.

    Imports the op's kernel modules on first use (:mod:`onnx_prepared.kernels.catalog`).
    """
    key = (domain, op_type, opset)
    got = _LOOKUPS.get(key, _UNKNOWN)
    if got is not _UNKNOWN:
        return got
    domain = normalize_domain(domain)
    catalog.ensure_loaded(domain, op_type)
    best = None
    for since, spec in REGISTRY.get((domain, op_type), {}).items():
        if since <= opset and (spec.until is None or opset < spec.until) and (best is None or since > best.since):
            best = spec
    _LOOKUPS[key] = best
    return best


#: lookup's answers by (domain as asked, op_type, opset), after the op's modules were loaded; emptied by
#: every registration (a module loaded later may add a version)
_LOOKUPS: dict[tuple[str, str, int], KernelSpec | None] = {}
_UNKNOWN = object()


def available(domain: str, op_type: str) -> list[str]:
    """Names of every registered implementation of an op (for error messages)."""
    domain = normalize_domain(domain)
    catalog.ensure_loaded(domain, op_type)
    return sorted(s.name for s in REGISTRY.get((domain, op_type), {}).values())


def specializes(kernel_fn: KernelFn):
    """Register ``fn`` as ``kernel_fn``'s specializer for inputs known when the plan is bound.

    ``fn(consts, n_inputs, **attrs)`` gets ``{input position: value}`` for the inputs that are constant
    in every run (a folded Constant node's value, None for an omitted optional input; maybe none at
    all), the node's input count and its attributes; it returns a call with the kernel's positional
    signature that does the constant part of the work once (an index, a target shape, settled
    attributes), or None to keep the kernel as it is.
    """

    def register(fn: Callable[..., KernelFn | None]) -> Callable[..., KernelFn | None]:
        kernel_fn.specialize = fn  # type: ignore[attr-defined]
        return fn

    return register
