"""ModelReplica: one serving replica's model, without Ray (the deployment in ``deployment.py`` wraps it).

Start-up is the cold path of the runtime, not a blocking load: the constructor opens a
:class:`~onnx_prepared.runtime.RuntimeSession` (metadata only, no weight byte read) and submits
``prepare_async()``; it returns before any weight is resident, so Ray Serve reports the replica ready
at once. A request that arrives meanwhile goes through ``run_async``: its layers compute as soon as their
prepared objects are published, in need order, while later layers still load.

The prepared cache is one companion model on a path every replica shares (``build_if_missing``): the
first replica to miss an entry prepacks and persists it, later replicas read it. Concurrent replicas
each prepack what they miss and merge their entries into the one companion (``prepared/cache.py``);
none waits for another's build.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_prepared.errors import InvalidFeedError, InvalidOptionError
from onnx_prepared.options import PreparedModelPolicy, SessionOptions
from onnx_prepared.serve.codec import dtype_of

RUNTIMES = ("onnx_prepared", "onnxruntime")


def companion_path(model_path: str | os.PathLike, cache_path: str | os.PathLike, model: Any = None) -> str:
    """The companion file a replica of ``model_path`` uses under ``cache_path``.

    A path ending in ``.onnx`` is the companion itself. Otherwise ``cache_path`` is a folder shared by
    every replica, and the companion is ``<folder>/<stem>-<digest16>.prepared.onnx``: the digest of the
    source model (``source_model_digest``) keeps two models of one name apart, and contains no path of
    this machine, so hosts that mount the share at different places use the same file.
    """
    cache_path = os.fspath(cache_path)
    if cache_path.endswith(".onnx"):
        return cache_path
    from onnx_prepared.prepared.cache import source_model_digest

    stem = os.path.splitext(os.path.basename(os.fspath(model_path)))[0]
    return os.path.join(cache_path, f"{stem}-{source_model_digest(model_path, model)[:16]}.prepared.onnx")


def session_options(options: Mapping[str, Any] | SessionOptions | None, *, companion: str | None) -> SessionOptions:
    """SessionOptions from a mapping of field names (validated by SessionOptions) plus the shared cache."""
    if isinstance(options, SessionOptions):
        so = options
    else:
        so = SessionOptions()
        for name, value in (options or {}).items():
            if not hasattr(so, name):
                raise InvalidOptionError(name, value, "a SessionOptions field")
            setattr(so, name, value)
    if companion is not None:
        so.prepared_model_path = companion
        if PreparedModelPolicy(so.prepared_model_policy) is PreparedModelPolicy.DISABLED:
            so.prepared_model_policy = PreparedModelPolicy.BUILD_IF_MISSING
    return so


class ModelReplica:
    """A model behind one replica: ``await replica.infer(feeds)`` -> {output name: array}.

    >>> r = ModelReplica("model.onnx", "/shared/prepared")   # returns before any weight is read
    >>> outputs = await r.infer({"x": x})                     # served while weights still load
    """

    runtime = "onnx_prepared"

    def __init__(self, model_path: str | os.PathLike, cache_path: str | os.PathLike | None = None,
                 options: Mapping[str, Any] | SessionOptions | None = None, *, session: Any = None) -> None:
        self.started, self.started_wall = time.perf_counter(), time.time()
        from onnx_prepared.model import load_model
        from onnx_prepared.runtime import RuntimeSession

        self.import_s = time.perf_counter() - self.started  # the runtime's modules, when this process had none
        self.first_request_s: float | None = None  # arrival of the first request, since construction start
        self.first_response_s: float | None = None
        self.model_path = os.fspath(model_path)
        if session is None:
            loaded = load_model(self.model_path)
            companion = None if cache_path is None else companion_path(self.model_path, cache_path, loaded.model)
            session = RuntimeSession(loaded, session_options(options, companion=companion))
        self.session = session
        self.session_s = time.perf_counter() - self.started - self.import_s
        graph = session.parts.loaded.graph
        weights = set(session.parts.loaded.weights)
        from onnx_prepared.runtime.feeds import type_string

        self.input_types = {i.name: dtype_of(type_string(i.type)) for i in graph.input if i.name not in weights}
        self.output_names = [o.name for o in graph.output]
        self.prepared_s: float | None = None
        self.flushed = 0
        self._done = threading.Event()
        self.preparing = session.prepare_async()  # returns at once: the replica is ready before its weights
        self.preparing.add_done_callback(self._prepared)
        self.ctor_s = time.perf_counter() - self.started

    def _prepared(self, handle: Any) -> None:
        # Persist in a thread of our own: the callback runs on a scheduler worker, and a flush waits for
        # the background persists that worker may still have to run.
        def finish() -> None:
            try:
                if handle.exception(timeout=0) is None:
                    self.flushed = self.session.flush_cache()
            except Exception:  # a cache that cannot be written is a miss next time, never a request error
                pass
            finally:
                self.prepared_s = time.perf_counter() - self.started
                self._done.set()

        threading.Thread(target=finish, name="onnx-prepared-serve-flush", daemon=True).start()

    async def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one request through ``run_async``: awaiting the handle never blocks the event loop."""
        if self.first_request_s is None:
            self.first_request_s = time.perf_counter() - self.started
        outputs = await self.session.run_async(self._check(feeds))
        if self.first_response_s is None:
            self.first_response_s = time.perf_counter() - self.started
        return dict(zip(self.output_names, outputs))

    def _check(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        unknown = set(feeds) - set(self.input_types)
        if unknown:
            raise InvalidFeedError(f"unknown input(s) {sorted(unknown)}; the model's inputs are "
                                   f"{sorted(self.input_types)}")
        return feeds

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """True once preparation ended and its cache entries were flushed (tests, benchmarks)."""
        return self._done.wait(timeout)

    def status(self) -> dict[str, Any]:
        c = self.session.companion
        return {"runtime": self.runtime, "model": self.model_path, "pid": os.getpid(), "started": self.started_wall,
                "import_s": self.import_s, "session_s": self.session_s, "ctor_s": self.ctor_s,
                "first_request_s": self.first_request_s, "first_response_s": self.first_response_s,
                "prepared": self._done.is_set(),
                "prepared_s": self.prepared_s, "cache": None if c is None else c.path,
                "cache_entries": None if c is None else len(c.entries()), "cache_written": self.flushed,
                "inputs": sorted(self.input_types), "outputs": self.output_names}

    def close(self) -> None:
        if self.preparing is not None and not self.preparing.done():
            self.preparing.cancel()
        self.session.close()


class OrtReplica:
    """The same replica over onnxruntime (the benchmark's reference): the session loads in the constructor,
    runs go to a thread so the event loop stays free."""

    runtime = "onnxruntime"

    def __init__(self, model_path: str | os.PathLike, cache_path: Any = None, options: Mapping[str, Any] | None = None,
                 **_: Any) -> None:
        self.started, self.started_wall = time.perf_counter(), time.time()
        import onnxruntime as ort

        self.import_s = time.perf_counter() - self.started
        self.first_request_s: float | None = None  # arrival of the first request, since construction start
        self.first_response_s: float | None = None
        self.model_path = os.fspath(model_path)
        so = ort.SessionOptions()
        threads = (options or {}).get("intra_op_num_threads")
        if threads:
            so.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(self.model_path, so, providers=["CPUExecutionProvider"])
        self.input_types = {i.name: dtype_of(i.type) for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.prepared_s = time.perf_counter() - self.started
        self.session_s = self.prepared_s - self.import_s
        self.ctor_s = self.prepared_s

    async def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import asyncio

        if self.first_request_s is None:
            self.first_request_s = time.perf_counter() - self.started
        outputs = await asyncio.to_thread(self.session.run, None, dict(feeds))
        if self.first_response_s is None:
            self.first_response_s = time.perf_counter() - self.started
        return dict(zip(self.output_names, outputs))

    def wait_prepared(self, timeout: float | None = None) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "model": self.model_path, "pid": os.getpid(), "started": self.started_wall,
                "import_s": self.import_s, "session_s": self.session_s, "ctor_s": self.ctor_s,
                "first_request_s": self.first_request_s, "first_response_s": self.first_response_s,
                "prepared": True, "prepared_s": self.prepared_s,
                "inputs": sorted(self.input_types), "outputs": self.output_names}

    def close(self) -> None:
        self.session = None


def open_replica(model_path: str | os.PathLike, cache_path: str | os.PathLike | None = None,
                 options: Mapping[str, Any] | None = None, *, runtime: str = "onnx_prepared") -> Any:
    """A ModelReplica, or an OrtReplica for ``runtime="onnxruntime"``."""
    if runtime not in RUNTIMES:
        raise InvalidOptionError("runtime", runtime, " | ".join(RUNTIMES))
    cls = OrtReplica if runtime == "onnxruntime" else ModelReplica
    return cls(model_path, cache_path, options)
