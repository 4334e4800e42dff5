"""Progress on long work: opt-in for library code, tqdm on a terminal only (issue 15, deliverable 3)."""

import numpy as np

from onnx_prepared import SessionOptions
from onnx_prepared.progress import reporter
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import gemm_mlp


def test_prepare_reports_through_a_callback_or_the_option_and_is_silent_otherwise(tmp_path, capsys):
    path = gemm_mlp(tmp_path)
    calls = []
    with RuntimeSession(path) as sess:
        sess.prepare(progress=lambda done, total: calls.append((done, total)))
        total = len(sess.plan.requirements)
    assert total > 0 and calls[-1] == (total, total)
    assert all(0 <= d <= t == total for d, t in calls) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    seen = []
    with RuntimeSession(path, SessionOptions(progress=lambda d, t: seen.append(d))) as sess:
        sess.prepare()
        (y,) = sess.run({"x": np.ones((1, 16), np.float32)})
    assert y.shape == (1, 16)
    assert seen[-1] == total
    with RuntimeSession(path) as sess:
        sess.prepare()  # no progress asked for: nothing printed
        sess.prepare(progress=True)  # asked, but stderr is not a terminal here: still nothing
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_reporter_is_quiet_without_a_terminal():
    assert reporter(True, 10, "x") is None  # pytest's stderr is not a TTY
    assert reporter(None, 10, "x") is None and reporter(False, 10, "x") is None
    fn = print
    assert reporter(fn, 10, "x") is fn and reporter(fn, 0, "x") is None


def _on_a_terminal(argv, cwd):
    """Run the CLI with stderr on a pseudo-terminal; returns (exit code, what the terminal showed)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    p = subprocess.Popen([sys.executable, "-m", "onnx_prepared.cli", *argv], stdout=subprocess.DEVNULL,
                         stderr=slave, cwd=cwd)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return p.wait(), b"".join(chunks).decode(errors="replace")


def test_long_commands_draw_a_bar_on_a_terminal(tmp_path):
    import pytest

    pytest.importorskip("tqdm")
    code, shown = _on_a_terminal(["generate", "tiny-llm", str(tmp_path / "m"), "--layers", "3", "--hidden", "64",
                                  "--intermediate", "128", "--heads", "4", "--kv-heads", "2", "--vocab", "256"],
                                 tmp_path)
    assert code == 0 and "generate:" in shown and "/3 [" in shown
    code, shown = _on_a_terminal(["cache", "build", str(tmp_path / "m" / "tiny-llm.onnx"), "--out",
                                  str(tmp_path / "c.onnx")], tmp_path)
    assert code == 0 and "prepare:" in shown and "obj" in shown
