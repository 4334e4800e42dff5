"""A real local Ray cluster: a Serve app with 2 replicas on one shared empty cache, real HTTP on 127.0.0.1.

Kept small for a shared 2-core machine: ``num_cpus=2``, no dashboard, a 100 MB object store, worker logs
not forwarded, and always shut down (also when setup fails). One test holds the whole cluster, so
``pytest -n 2`` starts it once; a machine-wide lock file (``LOCK``) keeps two test clusters (two xdist
workers, or two checkouts) from running at once, and each cluster has its own temp folder and ports.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from onnx_prepared.prepared.cache import PreparedModelStore, source_model_digest, verify
from onnx_prepared.serve import codec
from onnx_prepared.serve.replica import companion_path
from tests.helpers.serving import PROMPT, SMALL, direct_outputs, feeds, model_file, ort_outputs, small_llm

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

LOCK = os.path.join(tempfile.gettempdir(), "onnx-prepared-serve-test.lock")
LOCK_LIMIT = 600.0  # seconds: a bound on waiting for another test cluster to finish
TIMEOUT = 120  # seconds: a bound on one HTTP request


@contextlib.contextmanager
def machine_lock():
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + LOCK_LIMIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another Serve test cluster held {LOCK} for {LOCK_LIMIT} s")
                time.sleep(0.2)  # polling a lock held by another process (not synchronization within this test)
        yield
    finally:
        os.close(fd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = small_llm(tmp_path_factory.mktemp("serve-cluster-llm"))
    cache = str(tmp_path_factory.mktemp("serve-cluster-cache"))
    from onnx_prepared.serve import build_app

    with machine_lock():
        temp = tempfile.mkdtemp(prefix="opray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        port = free_port()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        started = time.perf_counter()
        try:
            ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False,
                     _temp_dir=temp, configure_logging=False)
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            app = build_app({"model_path": folder, "cache_path": cache, "num_replicas": 2,
                             "options": {"intra_op_num_threads": 1}})
            serve.run(app, name="tiny-llm", route_prefix="/tiny-llm")
            yield {"url": f"http://127.0.0.1:{port}/tiny-llm", "folder": folder, "cache": cache,
                   "ready_s": time.perf_counter() - started}
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def post(url: str, body: bytes, content_type: str = codec.JSON) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"content-type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def json_feeds(tokens=PROMPT) -> bytes:
    return json.dumps({"inputs": {n: {"data": v.reshape(-1).tolist(), "shape": list(v.shape), "dtype": str(v.dtype)}
                                  for n, v in feeds(tokens).items()}}).encode()


def test_two_replicas_share_one_cache_and_answer_over_http(cluster):
    url, model = cluster["url"], model_file(cluster["folder"])
    prompts = [PROMPT, [1, 2, 3], [200, 100, 50, 25, 12, 6]]
    want = {tuple(p): direct_outputs(model, p) for p in prompts}
    ort = {tuple(p): ort_outputs(model, p) for p in prompts}

    def check(tokens, got):
        for n, v in want[tuple(tokens)].items():
            np.testing.assert_array_equal(got[n], v)
            np.testing.assert_allclose(got[n], ort[tuple(tokens)][n], atol=1e-4, rtol=1e-3)

    # concurrent JSON requests while both replicas are still preparing, then .npz ones
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [(p, pool.submit(post, f"{url}/infer", json_feeds(p))) for p in prompts * 3]
        for tokens, job in jobs:
            status, body = job.result()
            assert status == 200, body
            check(tokens, codec.outputs_from_json(body))
    status, body = post(f"{url}/infer", codec.encode_npz(feeds([9, 8, 7])), codec.NPZ)
    assert status == 200
    np.testing.assert_array_equal(codec.decode_npz(body)["logits"], direct_outputs(model, [9, 8, 7])["logits"])

    # bad input: a 400 naming the problem, and the replica keeps serving
    status, body = post(f"{url}/infer", json.dumps({"inputs": {"nope": [1]}}).encode())
    assert status == 400 and "unknown input 'nope'" in json.loads(body)["error"]

    # text: the non-streaming answer and the stream carry the same greedy tokens
    status, body = post(f"{url}/generate", json.dumps({"tokens": PROMPT, "max_tokens": 5}).encode())
    assert status == 200
    tokens = json.loads(body)["tokens"]
    assert len(tokens) == 5 and all(0 <= t < SMALL.vocab for t in tokens)
    status, body = post(f"{url}/generate", json.dumps({"tokens": PROMPT, "max_tokens": 5, "stream": True}).encode())
    assert status == 200
    assert [json.loads(line)["token"] for line in body.decode().splitlines()] == tokens

    # both replicas run; once both prepared, the one companion holds every entry and verifies
    app = serve.status().applications["tiny-llm"]
    assert [d.replica_states for d in app.deployments.values()] == [{"RUNNING": 2}]
    deadline = time.monotonic() + TIMEOUT
    while True:  # bounded polling of the replicas' own report (status is per replica: ask until both said so)
        with urllib.request.urlopen(f"{url}/status", timeout=TIMEOUT) as r:
            st = json.loads(r.read())
        if st["prepared"]:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    path = companion_path(model, cluster["cache"])
    assert st["cache"] == path
    assert verify(path) == []
    store = PreparedModelStore(path, source_digest=source_model_digest(model), policy="read_only")
    try:
        assert store.invalid == {} and len(store.entries()) == st["cache_entries"] > 0
    finally:
        store.close()
