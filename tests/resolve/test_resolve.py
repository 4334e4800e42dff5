import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_prepared.errors import ManifestError
from onnx_prepared.model import load_model
from onnx_prepared.resolve import ManifestReader, resolve_model
from tests.helpers.models import gemm_mlp, save_external


def test_resolution_reads_no_payload(tmp_path, monkeypatch):
    path = gemm_mlp(tmp_path)
    model = load_model(path)

    def boom(*a, **k):
        raise AssertionError("payload read during resolution")

    monkeypatch.setattr("os.preadv", boom)
    monkeypatch.setattr("onnx_prepared.model.reader.ExternalDataReader.read_bytes", boom)
    r = resolve_model(model)
    assert r.complete and len(r.kernel_choices) == 6


def test_resolved_model_is_frozen(tmp_path):
    r = resolve_model(load_model(gemm_mlp(tmp_path)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.kernel_choices = ()
    with pytest.raises(TypeError):
        r.manifest.active["x"] = None
    g = r.graph()
    del g.node[:]  # mutating a copy never changes the resolved model
    assert len(r.graph().node) == 6


def test_transb_values_get_distinct_keys_and_identical_requests_share(tmp_path):
    r = resolve_model(load_model(gemm_mlp(tmp_path, layers=3, share_b=True)))
    packed = [q for q in r.requirements if not q.key.is_raw]
    # W0 used with transB=0 (layers 0 and 2, identical request -> one key) and transB=1 (layer 1)
    assert sorted(q.key.layout.split("-transB")[1][0] for q in packed) == ["0", "1"]
    shared = next(q for q in packed if "transB0" in q.key.layout)
    assert shared.consumers == (0, 4)
    assert all(q.sources == ("W0",) for q in packed)
    assert list(r.manifest.active) .count("W0") == 1


def test_dead_nodes_and_initializers_are_absent_from_manifest(tmp_path):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W")
    dead_w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "DEAD")
    unused = numpy_helper.from_array(np.ones(3, np.float32), "UNUSED")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("MatMul", ["x", "DEAD"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, dead_w, unused])
    path = save_external(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path)
    r = resolve_model(load_model(path))
    assert r.removed_nodes == 1
    assert set(r.manifest.active) == {"W"}
    assert set(r.dead_initializers) == {"DEAD", "UNUSED"}
    reader = ManifestReader(r.manifest)
    assert reader.read("W").shape == (4, 4)
    with pytest.raises(ManifestError, match="DEAD"):
        reader.read("DEAD")
    reader.close()


def test_reason_names_consumer(tmp_path):
    r = resolve_model(load_model(gemm_mlp(tmp_path, layers=1)))
    assert "gemm0" in r.manifest.active["W0"].reason
    assert r.manifest.active["c0"].reason.startswith("constant input")


def test_lineage_digest_from_checksums(tmp_path):
    path = gemm_mlp(tmp_path, layers=1)
    m = onnx.load(path, load_external_data=False)
    for t in m.graph.initializer:
        t.external_data.add(key="checksum", value="ab" * 32)
    onnx.save(m, path)
    loaded = load_model(path)
    # a recorded checksum states what the producer wrote: alone it is unverified (no digest, a miss)
    assert all(q.key.lineage_digest is None for q in resolve_model(loaded).requirements)

    class Sidecar:  # a companion that verified those bytes under the data file's current fingerprint
        def __init__(self, digest):
            self.digest = digest

        def source_digest_of(self, name):
            return self.digest

        def lookup(self, key):
            return None

    r = resolve_model(loaded, prepared=Sidecar("ab" * 32))
    assert all(q.key.lineage_digest is not None for q in r.requirements)
    r = resolve_model(loaded, prepared=Sidecar("cd" * 32))  # the sidecar disagrees with the model: distrusted
    assert all(q.key.lineage_digest is None for q in r.requirements)


def test_resolved_graph_keeps_initializer_names_only(tmp_path):
    """The transformed graph is serialized without payloads (creation time): initializer names alone, in
    graph order; their types and dims come through the manifest's descriptors."""
    inline = tmp_path / "inline.onnx"
    onnx.save(onnx.load(gemm_mlp(tmp_path)), inline)  # payloads embedded in the model proto
    model = load_model(inline)
    src = {t.name: t for t in model.graph.initializer}
    assert any(t.raw_data or t.float_data for t in src.values())  # embedded payloads in the source
    r = resolve_model(model)
    g = r.graph()
    assert {t.name for t in g.initializer} == set(src)
    assert [t.name for t in g.initializer] == list(src)
    for t in g.initializer:
        assert not t.raw_data and not t.float_data and not t.external_data and not t.dims
        d = r.manifest.active[t.name].descriptor
        assert (d.elem_type, list(d.dims)) == (src[t.name].data_type, list(src[t.name].dims))
    assert [n.SerializeToString() for n in g.node] == [n.SerializeToString() for n in model.graph.node]
    assert len(r.graph_bytes) < sum(len(t.SerializeToString()) for t in src.values())


def test_initializer_names_are_added_to_the_graph_copy_alone(tmp_path, monkeypatch):
    """The stored graph holds no initializer (the names are ``initializer_names``); ``graph()`` adds
    them to its copy, and the plan, which has every node's names recorded, reads the stored graph itself
    (no copy) and leaves it as it was."""
    from onnx_prepared import onnx_proto
    from onnx_prepared.plan.prepared_plan import build_prepared_plan
    from onnx_prepared.resolve.resolver import ResolvedModel

    r = resolve_model(load_model(gemm_mlp(tmp_path)))
    stored = onnx_proto.GraphProto()
    stored.ParseFromString(r.graph_bytes)
    assert not stored.initializer and r.initializer_names
    assert [t.name for t in r.graph().initializer] == list(r.initializer_names)
    assert not r.graph(initializers=False).initializer
    asked = []
    graph = ResolvedModel.graph
    monkeypatch.setattr(ResolvedModel, "graph", lambda self, **kw: asked.append(kw) or graph(self, **kw))
    before = r.graph_bytes
    plan = build_prepared_plan(r)
    assert asked == [] and r.graph_bytes == before
    assert [a.node_index for a in plan.execution.actions] == list(range(r.node_count))


def test_a_constants_payload_is_parsed_once(monkeypatch):
    """A Constant's tensor is converted once, when resolution parses its attributes: the plan folds the bound
    kernel's value (no second parse) and runs read the folded value."""
    import onnx_prepared
    from onnx_prepared import onnx_proto

    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([1, 2, 3]))),
             helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.float32(2))),
             helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    parsed = []
    to_array = onnx_proto.to_array
    monkeypatch.setattr(onnx_proto, "to_array", lambda t: parsed.append(t.dims) or to_array(t))
    sess = onnx_prepared.InferenceSession(model)
    assert len(parsed) == 2
    for _ in range(2):
        (y,) = sess.run(None, {"x": np.float32([1, 1, 1])})
        np.testing.assert_array_equal(y, np.float32([4, 6, 8]))
    assert len(parsed) == 2
