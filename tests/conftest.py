import os
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*TCP without encryption.*")


@pytest.fixture(scope="session")
def results_tmp(tmp_path_factory):
    """A private results folder: tests never overwrite the committed data/results."""
    d = tmp_path_factory.mktemp("results")
    old = os.environ.get("SINKBOOK_RESULTS")
    os.environ["SINKBOOK_RESULTS"] = str(d)
    yield d
    if old is None:
        os.environ.pop("SINKBOOK_RESULTS", None)
    else:
        os.environ["SINKBOOK_RESULTS"] = old


@pytest.fixture(scope="session")
def smollm2():
    from sinklib.core.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma3():
    from sinklib.core.models import load_model

    return load_model("gemma3-270m", device="cpu")
