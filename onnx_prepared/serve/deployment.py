"""The Ray Serve deployment and its application builder.

>>> from ray import serve
>>> from onnx_prepared.serve import build_app
>>> serve.run(build_app({"model_path": "m.onnx", "cache_path": "/shared/prepared", "num_replicas": 2}))

or, with a config file (``serve run``/``serve deploy``)::

    applications:
      - name: tiny-llm
        import_path: onnx_prepared.serve:build_app
        args: {model_path: /models/tiny-llm, cache_path: /shared/prepared, num_replicas: 2,
               options: {intra_op_num_threads: 1}}

Routes under the application's prefix: ``POST .../infer`` (or the prefix itself) takes tensors
(``codec``: JSON or ``application/x-npz``); ``POST .../generate`` takes a text request on a genai folder
(``text.TextReplica``; newline-delimited JSON pieces when ``"stream": true``); ``GET .../status``
describes the replica (runtime, preparation, cache).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from onnx_prepared.errors import InvalidFeedError, InvalidOptionError, MissingDependencyError, OnnxPreparedError
from onnx_prepared.serve import codec
from onnx_prepared.serve.replica import RUNTIMES, open_replica
from onnx_prepared.serve.text import TextReplica, is_genai_folder

try:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
except ImportError:
    raise MissingDependencyError("onnx_prepared.serve needs Ray Serve: pip install 'onnx-prepared[serve]'") from None

__all__ = ["PreparedModelDeployment", "build_app"]

#: build_app's arguments besides the replica's own (model_path, cache_path, options, runtime).
APP_ARGS = ("num_replicas", "num_cpus", "max_ongoing_requests", "name", "cache_locking")


@serve.deployment(ray_actor_options={"num_cpus": 1})
class PreparedModelDeployment:
    """One replica: a RuntimeSession on ``model_path`` with its prepared cache under ``cache_path``.

    The constructor returns before any weight is read (``prepare_async`` runs in the background), so
    Serve reports the replica ready at once and early requests run on the cold path.
    """

    def __init__(self, model_path: str, cache_path: str | None = None, options: Mapping[str, Any] | None = None,
                 runtime: str = "onnx_prepared") -> None:
        if runtime == "onnx_prepared" and is_genai_folder(model_path):
            self.replica = TextReplica(model_path, cache_path, options)
        else:
            self.replica = open_replica(model_path, cache_path, options, runtime=runtime)
        _freeze_startup_objects()

    async def __call__(self, request: Request) -> Response:
        route = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        try:
            if request.method == "GET":
                if route != "status":
                    return _error(404, f"GET {request.url.path}: only .../status is a GET route")
                return Response(json.dumps(self.replica.status()), media_type=codec.JSON)
            if route == "generate":
                return await self._generate(await request.body())
            return await self._infer(request.headers.get("content-type", ""), await request.body())
        except (InvalidFeedError, InvalidOptionError) as e:  # bad input: a clear message, the replica stays healthy
            return _error(400, str(e))
        except OnnxPreparedError as e:  # the model failed on this input (a kernel, a corrupt cache entry)
            return _error(500, f"{type(e).__name__}: {e}")

    async def _infer(self, content_type: str, body: bytes) -> Response:
        npz = content_type.startswith((codec.NPZ, "application/octet-stream"))
        feeds = codec.decode_npz(body) if npz else codec.decode_json(body, self.replica.input_types)
        t0 = time.perf_counter()
        outputs = await self.replica.infer(feeds)
        # which replica answered and how long the run took there (clients and benchmarks read them)
        headers = {"x-replica-pid": str(os.getpid()), "x-run-ms": f"{(time.perf_counter() - t0) * 1e3:.3f}"}
        if npz:
            return Response(codec.encode_npz(outputs), media_type=codec.NPZ, headers=headers)
        return Response(codec.encode_json(outputs), media_type=codec.JSON, headers=headers)

    async def _generate(self, body: bytes) -> Response:
        if not isinstance(self.replica, TextReplica):
            return _error(404, "POST .../generate needs a genai model folder (genai_config.json)")
        try:
            request = json.loads(body)
        except ValueError as e:
            return _error(400, f"request body is not JSON: {e}")
        if not isinstance(request, dict):
            return _error(400, "a generation request is a JSON object")
        pieces = self.replica.generate(request)
        if request.get("stream"):
            first = await anext(pieces)  # a bad request fails here, as a 400, not inside the stream

            async def lines():
                yield json.dumps(first) + "\n"
                async for p in pieces:
                    yield json.dumps(p) + "\n"

            return StreamingResponse(lines(), media_type="application/x-ndjson")
        got = [p async for p in pieces]
        text = None if self.replica.tokenizer is None else "".join(p["text"] for p in got)
        return Response(json.dumps({"tokens": [p["token"] for p in got], "text": text}), media_type=codec.JSON)

    def check_health(self) -> None:
        """Serve's health check: a replica whose preparation failed is replaced."""
        h = getattr(self.replica, "preparing", None)
        if h is not None and h.done() and not h.cancelled() and h.exception(timeout=0) is not None:
            raise RuntimeError(f"preparation failed: {h.exception(timeout=0)}")

    def __del__(self) -> None:
        replica = getattr(self, "replica", None)
        if replica is not None:
            replica.close()


def _freeze_startup_objects() -> None:
    """Move the objects alive at the constructor's end out of the collector's reach, as Serve does next.

    Serve runs ``gc.collect(); gc.freeze()`` right after the constructor (``RAY_SERVE_FREEZE_GC_ON_STARTUP``),
    before it reports the replica ready. That full collection walks every object the imports and the session
    made, holding the GIL while ``prepare_async`` reads and publishes weights, and it delayed the first request
    by ~100 ms. Freezing here first leaves it only the few objects made since; the frozen ones are the ones
    Serve would freeze a moment later. Nothing is frozen where Serve would not freeze either.
    """
    import gc

    try:
        from ray.serve._private.constants import RAY_SERVE_FREEZE_GC_ON_STARTUP
    except ImportError:  # another Serve layout: leave the collector to it
        return
    if RAY_SERVE_FREEZE_GC_ON_STARTUP:
        gc.freeze()


def _error(status: int, message: str) -> Response:
    return Response(json.dumps({"error": message}), status_code=status, media_type=codec.JSON)


def build_app(args: Mapping[str, Any]) -> Any:
    """The Serve application for ``serve.run`` or ``serve run onnx_prepared.serve:build_app key=value ...``.

    ``args``: ``model_path`` (an ``.onnx`` file or a genai folder; required), ``cache_path`` (the shared
    prepared cache: a folder, or the companion ``.onnx`` itself; None: no shared cache), ``options``
    (SessionOptions fields, a mapping or its JSON text), ``runtime`` (``onnx_prepared`` or ``onnxruntime``),
    ``num_replicas`` (default 1), ``num_cpus`` per replica (default 1), ``max_ongoing_requests``, ``name``,
    ``cache_locking`` (False: the share has no usable flock; sets ``ONNX_PREPARED_CACHE_LOCKING=0`` in the
    replicas' environment; default: locks, off by themselves where flock fails).
    """
    args = dict(args)
    if "model_path" not in args:
        raise InvalidOptionError("model_path", None, "the model's .onnx file or genai folder")
    unknown = set(args) - {"model_path", "cache_path", "options", "runtime", *APP_ARGS}
    if unknown:
        raise InvalidOptionError(sorted(unknown)[0], args[sorted(unknown)[0]], "an argument of build_app")
    options = args.get("options") or {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError:
            raise InvalidOptionError("options", options, "a JSON object of SessionOptions fields") from None
    runtime = args.get("runtime", "onnx_prepared")
    if runtime not in RUNTIMES:
        raise InvalidOptionError("runtime", runtime, " | ".join(RUNTIMES))
    model_path = os.path.abspath(os.fspath(args["model_path"]))
    cache_path = args.get("cache_path")
    cache_path = None if cache_path in (None, "") else os.path.abspath(os.fspath(cache_path))
    extra: dict[str, Any] = {"num_replicas": int(args.get("num_replicas", 1)),
                             "ray_actor_options": {"num_cpus": float(args.get("num_cpus", 1))}}
    locking = args.get("cache_locking")
    if locking is not None:
        if isinstance(locking, str):
            if locking.strip().lower() not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
                raise InvalidOptionError("cache_locking", locking, "true or false")
            locking = locking.strip().lower() in ("1", "true", "yes", "on")
        from onnx_prepared.prepared.cache_io import LOCKING_ENV  # here: the replica's class loads no runtime

        env = {LOCKING_ENV: "1" if locking else "0"}
        extra["ray_actor_options"]["runtime_env"] = {"env_vars": env}
    if args.get("max_ongoing_requests") is not None:
        extra["max_ongoing_requests"] = int(args["max_ongoing_requests"])
    if args.get("name"):
        extra["name"] = str(args["name"])
    return PreparedModelDeployment.options(**extra).bind(model_path, cache_path, dict(options), runtime)
