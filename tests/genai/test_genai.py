"""Text generation from builder-made model folders (issue 15, deliverable 1).

Greedy tokens are compared with onnxruntime-genai where it is installed and with onnxruntime driven step
by step through the same loop otherwise (and always). The fixtures have no tokenizer.json: the test writes
the builder's word-level tokenizer (the one ``tests/fixtures/make_genai.py`` saved) with ``tokenizers``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import onnx_prepared.genai as og
from onnx_prepared.errors import InvalidOptionError, MissingDependencyError, ModelLoadError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
FOLDERS = ("genai_fp32", "genai_int4", "genai_int4_qwen_asym")


def with_tokenizer(name: str, dest) -> str:
    """A copy of fixture ``name`` plus a word-level tokenizer.json ("<5> <17>" <-> [5, 17])."""
    tokenizers = pytest.importorskip("tokenizers")
    folder = os.path.join(dest, name)
    shutil.copytree(os.path.join(FIXTURES, name), folder, ignore=shutil.ignore_patterns("reference.npz"))
    vocab = {f"<{i}>": i for i in range(3, 256)} | {"<unk>": 0, "<s>": 1, "</s>": 2}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.save(os.path.join(folder, "tokenizer.json"))
    return folder


def greedy(model, prompt, max_length: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    g = og.Generator(model, params)
    g.append_tokens(prompt)
    out = []
    while not g.is_done():
        g.generate_next_token()
        out.append(int(g.get_next_tokens()[0]))
    assert list(g.get_sequence(0)) == list(prompt) + out
    return out


def ort_session(path):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", FOLDERS)
def test_greedy_tokens_match_onnxruntime_genai_and_onnxruntime(name):
    folder = os.path.join(FIXTURES, name)
    ref = np.load(os.path.join(folder, "reference.npz"))
    prompt = ref["input_ids"][0].astype(np.int32)
    max_length = prompt.size + 12
    ours = greedy(og.Model(folder), prompt, max_length)
    assert ours[:3] == list(ref["tokens"])  # onnxruntime's tokens recorded by the fixture's maker
    theirs = greedy(og.Model(folder, session=ort_session(os.path.join(folder, "model.onnx"))), prompt, max_length)
    assert ours == theirs
    try:
        import onnxruntime_genai as ogx
    except ImportError:
        return
    m = ogx.Model(folder)
    params = ogx.GeneratorParams(m)
    params.set_search_options(max_length=max_length, do_sample=False)
    g = ogx.Generator(m, params)
    g.append_tokens(prompt[None])
    want = []
    while not g.is_done():
        g.generate_next_token()
        want.append(int(g.get_next_tokens()[0]))
    assert ours == want


def test_tokenizer_stream_and_sampling(tmp_path):
    folder = with_tokenizer("genai_int4", tmp_path)
    model = og.Model(folder)
    tok = og.Tokenizer(model)
    ids = tok.encode("<5> <17> <33>")
    assert ids.tolist() == [5, 17, 33] and ids.dtype == np.int32 and tok.decode(ids) == "<5> <17> <33>"
    stream = tok.create_stream()
    assert "".join(stream.decode(t) for t in [5, 17, 33]) == "<5> <17> <33>"
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=20, do_sample=True, top_k=5, temperature=0.7, random_seed=3)
    runs = []
    for _ in range(2):
        g = og.Generator(model, params)
        g.append_tokens(ids)
        while not g.is_done():
            g.generate_next_token()
        runs.append(g.get_sequence(0).tolist())
    assert runs[0] == runs[1] and len(runs[0]) == 20  # seeded: reproducible
    with pytest.raises(InvalidOptionError, match="top_p"):
        params.set_search_options(top_p=1.5)
    with pytest.raises(InvalidOptionError, match="a search option"):
        params.set_search_options(beams=2)


def test_generate_text_streams_the_greedy_text_and_reports_speed(tmp_path):
    folder = with_tokenizer("genai_int4", tmp_path)
    prompt = "<5> <17> <33> <101>"
    want = greedy(og.Model(folder, session=ort_session(os.path.join(folder, "model.onnx"))),
                  np.array([5, 17, 33, 101], np.int32), 4 + 8)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", "generate-text", folder, "--prompt", prompt,
                        "--max-tokens", "8"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == prompt + "".join(f" <{t}>" for t in want) + "\n"
    assert "time to first output" in r.stderr and "tokens/s" in r.stderr and "prepared cache" in r.stderr
    r = subprocess.run([sys.executable, "-m", "onnx_prepared.cli", "generate-text", folder, "--prompt", prompt,
                        "--max-tokens", "8", "--no-cache", "--top-p", "2"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "expected a number in (0, 1]" in r.stderr


def test_missing_pieces_have_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match=r"no genai_config\.json"):
        og.Model(tmp_path)
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.json"):
        og.Tokenizer(os.path.join(FIXTURES, "genai_int4"))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'onnx-prepared\[genai\]'"):
        og.Tokenizer(os.path.join(FIXTURES, "genai_int4"))


def test_tokenizer_stream_reassembles_multibyte_text_of_a_byte_level_bpe(tmp_path):
    """A byte-level BPE splits characters across tokens: the stream emits text only once it is whole."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox", "jumps over the lazy dog", "naïve café", "東京 and 大阪"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel
                                                        .alphabet(), show_progress=False))
    tok.save(str(tmp_path / "tokenizer.json"))
    t = og.Tokenizer(str(tmp_path))
    text = "the café in 東京 jumps"
    ids = t.encode(text)
    stream = t.create_stream()
    pieces = [stream.decode(i) for i in ids]
    assert "".join(pieces) == t.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_repetition_penalty_divides_or_multiplies_the_seen_tokens_logits():
    """onnxruntime-genai's rule: each token already in the sequence has its logit divided by the penalty if
    positive, multiplied if not; greedy then takes the argmax."""
    folder = os.path.join(FIXTURES, FOLDERS[0])
    prompt = np.load(os.path.join(folder, "reference.npz"))["input_ids"][0].astype(np.int32)
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.size + 8, repetition_penalty=1.5)
    g = og.Generator(model, params)
    g.append_tokens(prompt)
    steps = 0
    while not g.is_done():
        logits = g.get_logits()[0].astype(np.float32)
        seen = sorted({int(t) for t in g.get_sequence(0)})
        v = logits[seen]
        logits[seen] = np.where(v > 0, v / np.float32(1.5), v * np.float32(1.5))
        g.generate_next_token()
        assert int(g.get_next_tokens()[0]) == int(np.argmax(logits))
        steps += 1
    assert steps == 8
