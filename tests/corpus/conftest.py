import pytest

from tests.helpers import corpus_cache


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """``corpus(name) -> CorpusModel``: exported on first use in this test session, then cached."""
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    folder = corpus_cache.shared_dir(tmp_path_factory)
    return lambda name: corpus_cache.get(folder, name)
