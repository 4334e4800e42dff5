"""CLI hygiene: one-line errors, exit codes 0/1/2, argument checks, no data loss (issue 15, deliverable 4)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnx_prepared.cli import build_parser, main
from tests.helpers.models import gemm_mlp, reference_mlp


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlp")
    path = gemm_mlp(folder)
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    np.savez(folder / "named.npz", x=x)
    np.savez(folder / "positional.npz", x)
    (folder / "text.npz").write_text("not numpy\n")
    return path, folder, x


def run_cli(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        sys.exit(main(list(argv)))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_top_level_help_lists_every_command_without_rst():
    text = build_parser().format_help()
    for cmd in ("demo", "run", "inspect", "generate", "cache"):
        assert f"    {cmd} " in text
    assert "``" not in text and "0 success" in text and "2 usage" in text


def test_run_maps_npz_keys_and_positions_to_inputs_and_prints_values(mlp, capsys, tmp_path):
    path, folder, x = mlp
    want = reference_mlp(path, x)
    for feeds in ("named.npz", "positional.npz"):
        code, out, err = run_cli(capsys, "run", path, "--feeds", str(folder / feeds), "--out",
                                 str(tmp_path / "o.npz"), "--print", "--repeat", "3")
        assert code == 0, err
        with np.load(tmp_path / "o.npz") as z:
            np.testing.assert_allclose(z["r2"], want, rtol=1e-3, atol=1e-4)
        k = int(np.argmax(want[0]))
        assert "r2: float32 [2, 16]" in out and f"{want[0, k]:.5f}"[:6] in out
        assert "first run" in err and "steady run" in err


def test_run_with_a_cache_builds_then_reads_it(mlp, capsys, tmp_path):
    path, folder, _ = mlp
    cache = str(tmp_path / "c.onnx")
    code, _, err = run_cli(capsys, "run", path, "--feeds", str(folder / "named.npz"), "--cache", cache)
    assert code == 0 and f"build_if_missing: {cache}" in err
    code, _, err = run_cli(capsys, "run", path, "--feeds", str(folder / "named.npz"), "--cache", cache,
                           "--policy", "read_only")
    assert code == 0 and "read_only" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--feeds", "{folder}/missing.npz"], "feeds file '{folder}/missing.npz' does not exist"),
    (["--feeds", "{folder}/text.npz"], "not a NumPy .npz or .npy file"),
    ([], "--feeds is required: the model's inputs are x (tensor(float) ['n', 16])"),
    (["--feeds", "{folder}/named.npz", "--repeat", "0"], "expected an integer >= 1"),
    (["--feeds", "{folder}/named.npz", "--memory-limit", "lots"], "positive byte count"),
    (["--feeds", "{folder}/named.npz", "--policy", "sometimes"], "invalid choice"),
])
def test_run_usage_errors_are_one_line_exit_2(mlp, capsys, args, message):
    path, folder, _ = mlp
    code, _out, err = run_cli(capsys, "run", path, *[a.format(folder=folder) for a in args])
    assert code == 2 and message.format(folder=folder) in err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("onnx-prepared run: error:")


def test_cache_commands_exit_codes(mlp, capsys, tmp_path):
    path, _folder, _ = mlp
    code, _, err = run_cli(capsys, "cache", "info", path)  # a model, not a companion: one line, exit 1
    assert code == 1 and len(err.strip().splitlines()) == 1 and "not a companion prepared model" in err
    code, out, err = run_cli(capsys, "cache", "verify", path)
    assert code == 1 and "onnx_light" not in out + err
    for sub in ("info", "verify"):  # a missing path is a usage error for both
        code, _, err = run_cli(capsys, "cache", sub, str(tmp_path / "nothing.onnx"))
        assert code == 2 and "does not exist" in err


def test_inspect_plan_fits_100_columns_and_keeps_whole_names(capsys, tmp_path):
    from onnx_prepared.generate import generate_tiny_llm
    from onnx_prepared.model import load_model
    from onnx_prepared.plan.prepared_plan import build_prepared_plan
    from onnx_prepared.resolve import resolve_model

    path = generate_tiny_llm(tmp_path, layers=1, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256)
    code, out, _ = run_cli(capsys, "inspect", path, "--plan")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 100
    flat = " ".join(line.strip() for line in out.splitlines())
    for t in build_prepared_plan(resolve_model(load_model(path))).tasks:
        assert t.id.replace(" ", "") in flat.replace(" ", "")
    code, wide, _ = run_cli(capsys, "inspect", path, "--plan", "--wide")
    assert code == 0 and wide.splitlines()[0].startswith("Task")


def test_a_closed_pipe_is_not_a_traceback(mlp):
    path, _, _ = mlp
    p = subprocess.run(f"{sys.executable} -m onnx_prepared.cli inspect {path} --plan | head -c 10",
                       shell=True, capture_output=True, text=True)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_demo_never_overwrites_a_model_it_did_not_generate(tmp_path):
    from onnx_prepared.demo import DEMO_SUBFOLDER, ensure_model
    from onnx_prepared.errors import ModelLoadError
    from onnx_prepared.generate import MODEL_FILE, generate_tiny_llm

    foreign = generate_tiny_llm(tmp_path, layers=1, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256)
    before = Path(foreign).read_bytes()
    path, seconds = ensure_model(str(tmp_path))
    assert path == os.path.join(tmp_path, DEMO_SUBFOLDER, MODEL_FILE) and seconds is not None
    assert Path(foreign).read_bytes() == before
    assert ensure_model(str(tmp_path)) == (path, None)  # reused, not regenerated
    other = tmp_path / "other"
    (other / DEMO_SUBFOLDER).mkdir(parents=True)
    (other / "tiny-llm.data").write_bytes(b"x")  # a stray data file also counts as occupied
    (other / DEMO_SUBFOLDER / "genai_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="did not generate"):
        ensure_model(str(other))
    assert (other / "tiny-llm.data").read_bytes() == b"x"


def test_demo_steps(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "demo", "--dir", str(tmp_path), "--steps", "0")
    assert code == 0 and "0 greedy decode steps" in out
    tokens = out.split("greedy tokens (ours): ")[1].splitlines()[0]
    assert len(eval(tokens)) == 1  # the prefill's token only
    code, _, err = run_cli(capsys, "demo", "--dir", str(tmp_path), "--steps", "-1")
    assert code == 2 and "expected an integer >= 0" in err
