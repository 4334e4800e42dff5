"""build_app without a cluster: the arguments ``serve run`` and config files pass, and the errors it names."""

from __future__ import annotations

import pytest

from onnx_prepared.errors import InvalidOptionError

pytest.importorskip("ray.serve")


def test_build_app_takes_serve_run_arguments():
    import importlib

    from ray.serve import Application

    from onnx_prepared.serve import build_app

    # `serve run onnx_prepared.serve:build_app` resolves the module, then the attribute
    assert importlib.import_module("onnx_prepared.serve").build_app is build_app
    # `serve run ... key=value` passes strings; a config file passes YAML values
    app = build_app({"model_path": "m.onnx", "cache_path": "/shared", "num_replicas": "2", "num_cpus": "0.5",
                     "options": '{"intra_op_num_threads": 1}', "name": "llm"})
    assert isinstance(app, Application)
    d = getattr(app, "_bound_deployment", None)  # Ray's internal view of the bound deployment
    if d is None:
        pytest.skip("this Ray version does not expose the bound deployment")
    assert d.name == "llm" and d.num_replicas == 2 and d.ray_actor_options["num_cpus"] == 0.5
    model, cache, options, runtime = d.init_args
    assert model.endswith("/m.onnx") and cache == "/shared" and options == {"intra_op_num_threads": 1}
    assert runtime == "onnx_prepared"
    d = build_app({"model_path": "m.onnx", "cache_locking": "false"})._bound_deployment
    assert d.ray_actor_options["runtime_env"] == {"env_vars": {"ONNX_PREPARED_CACHE_LOCKING": "0"}}


@pytest.mark.parametrize(("args", "match"), [
    ({}, "model_path"),
    ({"model_path": "m.onnx", "replicas": 2}, "replicas"),
    ({"model_path": "m.onnx", "runtime": "tensorrt"}, "runtime"),
    ({"model_path": "m.onnx", "options": "{not json"}, "options"),
    ({"model_path": "m.onnx", "cache_locking": "maybe"}, "cache_locking"),
])
def test_build_app_names_a_bad_argument(args, match):
    from onnx_prepared.serve import build_app

    with pytest.raises(InvalidOptionError, match=match):
        build_app(args)


def test_the_deployment_class_loads_no_runtime():
    """A replica process imports the deployment's module before its constructor: the runtime loads in the
    constructor (the replica's measured import phase), and only there."""
    import subprocess
    import sys

    code = ("import sys, onnx_prepared.serve.deployment\n"
            "print(sorted(m for m in sys.modules if m.startswith(('onnx_prepared.runtime', 'onnx_prepared.model',"
            " 'onnx_prepared.prepared'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("serve_freezes", ["1", "0"])
def test_the_constructor_freezes_what_serve_would_freeze(tmp_path, serve_freezes):
    """Serve collects and freezes the heap after the constructor, before the replica counts as ready:
    the constructor freezes its objects first (that full collection, racing ``prepare_async`` for the
    GIL, held the first request back ~100 ms), and only where Serve freezes at all."""
    import os
    import subprocess
    import sys

    from tests.helpers.serving import model_file, small_llm

    model = model_file(small_llm(tmp_path))
    code = ("import gc, sys\n"
            "from onnx_prepared.serve.deployment import PreparedModelDeployment\n"
            "d = PreparedModelDeployment.func_or_class(sys.argv[1])\n"
            "print(gc.get_freeze_count() > 0)\n"
            "d.replica.close()\n")
    env = {**os.environ, "RAY_SERVE_FREEZE_GC_ON_STARTUP": serve_freezes}
    out = subprocess.run([sys.executable, "-c", code, model], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == str(serve_freezes == "1")
