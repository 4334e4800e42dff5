"""kernels/registry.py's keyword_params: what every registered kernel takes by keyword, read from its code
object, is what ``inspect.signature`` says (the binder passes only these attributes)."""

from __future__ import annotations

import functools
import inspect

from onnx_prepared.kernels import catalog, registry


def _by_inspect(fn) -> tuple[frozenset[str], bool]:
    sig = inspect.signature(fn)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return (frozenset(n for n, p in sig.parameters.items() if p.kind in kinds),
            any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()))


def test_every_registered_kernel_agrees_with_inspect():
    catalog.load_all()
    specs = [s for versions in registry.REGISTRY.values() for s in versions.values()]
    assert len(specs) > 100
    for s in specs:
        assert (s.params, s.var_kwargs) == _by_inspect(s.fn), s.name


def test_shapes_the_code_object_does_not_tell():
    def plain(a, b=1, /, c=2, *rest, d, e=3, **kw):
        return ()

    @functools.wraps(plain)
    def wrapped(*args, **kwargs):
        return plain(*args, **kwargs)

    def described(x):
        return ()

    described.__signature__ = inspect.signature(plain)
    for fn in (plain, wrapped, described, functools.partial(plain, 1), max):
        try:
            want = _by_inspect(fn)
        except ValueError:  # a builtin without a signature: both refuse
            continue
        assert registry.keyword_params(fn) == want
    assert registry.keyword_params(plain) == (frozenset({"c", "d", "e"}), True)
