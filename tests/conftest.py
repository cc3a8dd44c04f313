import os

import pytest

# Tests never touch the user's cache: everything built goes under pytest's temporary folder.


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    os.environ["UNIMODAL_CACHE"] = str(tmp_path_factory.mktemp("unimodal-cache"))
    yield


@pytest.fixture(scope="session")
def tiny_scenes(tmp_path_factory):
    """A 40-sample scenes build (train 32 / val 4 / test 4 / heldout 4), with speech."""
    from training.data.build import build

    return build("scenes", n=40, seed=0, out=tmp_path_factory.mktemp("data") / "scenes", progress=False)
