"""InferenceSession: onnxruntime's API over a RuntimeSession (switch by changing one import).

Everything runs through prepared execution: the model is resolved metadata-only, and the first
``run`` starts while weights are still being read and prepacked. ``run`` is
``run_async().result()`` of the underlying :class:`~onnx_prepared.runtime.RuntimeSession`.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onnx_prepared import onnx_proto as onnx
from onnx_prepared.compat.ortvalue import OrtValue, unwrap
from onnx_prepared.errors import InvalidFeedError
from onnx_prepared.model import LoadedModel, load_model
from onnx_prepared.model.loader import describe_model, load_model_bytes
from onnx_prepared.options import SessionOptions
from onnx_prepared.records import record
from onnx_prepared.runtime import RuntimeSession
from onnx_prepared.runtime.feeds import shape_of, type_string
from onnx_prepared.scheduler import ExecutionHandle

if TYPE_CHECKING:
    from onnx_prepared.compat.iobinding import IOBinding

__all__ = ["InferenceSession", "ModelMetadata", "NodeArg", "SessionOptions"]


@record(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, strings or None), type string."""

    name: str
    shape: list
    type: str


@record(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


class InferenceSession:
    """Run an ONNX model; shaped like ``onnxruntime.InferenceSession``.

    >>> sess = InferenceSession("model.onnx")
    >>> (y,) = sess.run(None, {"x": x})
    """

    def __init__(self, path_or_bytes: str | os.PathLike | bytes | onnx.ModelProto,
                 sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, provider_options: Sequence[dict] | None = None,
                 **kwargs: Any) -> None:
        self._options = sess_options or SessionOptions()
        if providers is not None:  # onnxruntime's warning for each provider this build lacks, then CPU
            from onnx_prepared.compat.api import check_providers

            check_providers(providers, provider_options)
        # NOTE: construction allocates thousands of short-lived, acyclic objects (protobuf wrappers, name
        # tuples, records); the cyclic collector's passes over them (and, for its older generations, over
        # the caller's whole heap) were ~10 % of a small CNN's construction (bn_cnn_opset9 3.8 -> 3.4 ms
        # CPU, load ~4). Paused here as the package import pauses it; a caller's gc.disable() is kept.
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            model = _load(path_or_bytes)
            self._rt = RuntimeSession(model, self._options)
        finally:
            if paused:
                gc.enable()
        self._profiling_start_ns = time.time_ns() if self._rt.options.records_trace else 0
        g = model.graph
        self._weights = model.weights
        self._inputs: list[NodeArg] | None = None  # built on the first get_inputs()
        self._overridable: list[NodeArg] | None = None
        self._outputs: list[NodeArg] | None = None  # get_outputs() runs shape inference on first call
        self._output_index = {o.name: i for i, o in enumerate(g.output)}
        self._meta = model.model

    @property
    def runtime(self) -> RuntimeSession:
        """The prepared-execution session underneath (prepare_async, run_async, plan, store)."""
        return self._rt

    # ---- onnxruntime-compatible surface ----
    def get_inputs(self) -> list[NodeArg]:
        if self._inputs is None:
            self._describe_inputs()
        return list(self._inputs)

    def _describe_inputs(self) -> None:
        # on first use, not at construction: most callers never ask (session creation is measured)
        g = self._meta.graph
        init_names = set(self._weights) | {sp.values.name for sp in g.sparse_initializer}
        self._inputs = [NodeArg(i.name, shape_of(i.type), type_string(i.type)) for i in g.input
                        if i.name not in init_names]
        self._overridable = [NodeArg(i.name, shape_of(i.type), type_string(i.type)) for i in g.input
                             if i.name in init_names]

    def get_outputs(self) -> list[NodeArg]:
        """Declared output shapes merged with shape inference, as onnxruntime reports them
        (see :mod:`onnx_prepared.compat.metadata`); computed on first call."""
        if self._outputs is None:
            from onnx_prepared.compat.metadata import output_shapes

            g = self._meta.graph
            self._outputs = [NodeArg(o.name, shape, type_string(o.type))
                             for o, shape in zip(g.output, output_shapes(self._meta))]
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Graph inputs with an initializer default: feeding one overrides the initializer."""
        if self._overridable is None:
            self._describe_inputs()
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    def get_provider_options(self) -> dict[str, dict]:
        return {"CPUExecutionProvider": {}}

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Sequence[dict] | None = None) -> None:
        """Accepted like onnxruntime's (a warning for each provider this build lacks); CPU stays in use."""
        from onnx_prepared.compat.api import check_providers

        check_providers(providers, provider_options)

    def disable_fallback(self) -> None:
        """onnxruntime's switch for falling back to CPU when a provider fails: CPU is all there is."""

    def enable_fallback(self) -> None:
        """See :meth:`disable_fallback`."""

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        m = self._meta
        return ModelMetadata(m.producer_name, m.graph.name, m.domain, m.doc_string, m.graph.doc_string,
                             m.model_version, {p.key: p.value for p in m.metadata_props})

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list:
        """Outputs named by ``output_names`` (all graph outputs when None), in that order.

        Feeds are checked against the graph's declared types: an unknown or missing name, a wrong
        dtype, rank or fixed dimension raises InvalidFeedError. Sequences are lists, optionals may be
        None. Thread-safe: each call is its own submission.
        """
        pick = self._picker(output_names)
        return pick(self._rt.run(_plain_feeds(input_feed)))

    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ortvalues: Mapping[str, Any],
                            run_options: Any = None) -> list[OrtValue]:
        """:meth:`run` with OrtValue feeds and OrtValue results (plain arrays are accepted as feeds too)."""
        return [OrtValue(v) for v in self.run(output_names, input_dict_ortvalues, run_options)]

    def io_binding(self) -> IOBinding:
        """A new :class:`~onnx_prepared.compat.iobinding.IOBinding` for :meth:`run_with_iobinding`."""
        from onnx_prepared.compat.iobinding import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: Any = None) -> None:
        """Run with the binding's inputs; its outputs are then ``iobinding.get_outputs()``."""
        iobinding._run(run_options)

    def end_profiling(self) -> str:
        """Write the task trace recorded since the session started as a Chrome trace (a JSON array of
        events, as onnxruntime writes its profile) to ``<profile_file_prefix>_<date>_<time>.json`` in the
        current folder and return that name; "" when profiling (``enable_profiling``) is off or ended."""
        trace = self._rt.scheduler.trace if self._profiling_start_ns else None
        if trace is None:
            return ""
        self._profiling_start_ns = 0
        prefix = getattr(self._rt.options, "profile_file_prefix", "onnxruntime_profile_")
        path = f"{prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        import json  # only end_profiling writes JSON

        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace.to_chrome()["traceEvents"], f)
        return path

    def get_profiling_start_time_ns(self) -> int:
        return self._profiling_start_ns

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Callable[[list | None, Any, str], Any], user_data: Any = None,
                  run_options: Any = None) -> ExecutionHandle:
        """onnxruntime's ``run_async``: ``callback(results, user_data, err)`` runs when the run ends.

        ``err`` is "" on success (results is the output list), else the error message (results None).
        Returns the underlying :class:`ExecutionHandle` as well, for ``await`` or ``cancel``.
        """
        pick = self._picker(output_names)
        handle = self._rt.run_async(_plain_feeds(input_feed))

        def done(h: ExecutionHandle) -> None:
            try:
                results = pick(h.result())
            except BaseException as e:
                callback(None, user_data, f"{type(e).__name__}: {e}")
            else:
                callback(results, user_data, "")

        handle.add_done_callback(done)
        return handle

    def prepare(self) -> None:
        """Read and prepack every weight now (optional: ``run`` never waits for it)."""
        self._rt.prepare()

    def close(self) -> None:
        self._rt.close()

    def _picker(self, output_names: Sequence[str] | None) -> Callable[[list], list]:
        if output_names is None:
            return lambda outs: outs
        try:
            idx = [self._output_index[n] for n in output_names]
        except KeyError as e:
            raise InvalidFeedError(f"unknown output {e.args[0]!r}; outputs: {list(self._output_index)}") from None
        return lambda outs: [outs[i] for i in idx]


def _plain_feeds(feeds: Mapping[str, Any]) -> Mapping[str, Any]:
    """``feeds`` with OrtValues replaced by what they hold (onnxruntime accepts both in ``run``)."""
    for v in feeds.values():
        if type(v) is OrtValue:
            return {k: unwrap(x) for k, x in feeds.items()}
    return feeds


def _load(source: str | os.PathLike | bytes | onnx.ModelProto | LoadedModel) -> LoadedModel:
    """A LoadedModel from a path (metadata-only), serialized bytes or an in-memory ModelProto.

    External data of an in-memory model resolves against the current directory, as onnxruntime does.
    """
    if isinstance(source, LoadedModel):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return load_model_bytes(source, os.getcwd())
    if isinstance(source, onnx.ModelProto):
        return describe_model(source, os.getcwd())
    return load_model(source)
