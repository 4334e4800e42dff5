"""Scale-out on Ray Serve: replicas that share one prepared cache (``pip install 'onnx-prepared[serve]'``).

>>> from ray import serve
>>> from onnx_prepared.serve import build_app
>>> serve.run(build_app({"model_path": "tiny-llm", "cache_path": "/shared/prepared", "num_replicas": 2}))

``serve run onnx_prepared.serve:build_app model_path=... cache_path=...`` (or a config file naming the
same import path) deploys it from the command line. ``ModelReplica`` / ``TextReplica`` are the replica
without Ray. Ray loads only with the deployment (``build_app``, ``PreparedModelDeployment``); see
docs/serving.md.
"""

from onnx_prepared.lazy import lazy_attributes

_LAZY = {**dict.fromkeys(("PreparedModelDeployment", "build_app"), "deployment"),
         **dict.fromkeys(("ModelReplica", "OrtReplica", "companion_path", "open_replica"), "replica"),
         "TextReplica": "text"}

__getattr__ = lazy_attributes(__name__, globals(), _LAZY)

__all__ = ["ModelReplica", "OrtReplica", "PreparedModelDeployment", "TextReplica", "build_app", "companion_path",
           "open_replica"]
