"""Build corpus models once per test session, shared by pytest-xdist workers (a file lock per model)."""

from __future__ import annotations

import fcntl
import os
import pickle

from tests.helpers.corpus import MODELS, CorpusModel


def shared_dir(tmp_path_factory) -> str:
    """One folder for the whole test session: xdist workers' base temps share a parent."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = os.path.join(root, "corpus")
    os.makedirs(folder, exist_ok=True)
    return folder


def get(folder: str, name: str) -> CorpusModel:
    """The corpus model ``name`` in ``folder``, exported on first request (by whichever worker asks first)."""
    meta = os.path.join(folder, f"{name}.pkl")
    with open(os.path.join(folder, f"{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(meta):
            with open(meta, "rb") as f:
                return pickle.load(f)
        cm = MODELS[name](folder)
        with open(meta + ".tmp", "wb") as f:
            pickle.dump(cm, f)
        os.replace(meta + ".tmp", meta)
        return cm
