"""conftest.py: fixtures of the binding's tests: the tiny model with its tokenizer.json and
without one (tests/serve/smtest.py, on PYTHONPATH), opened through the binding.  The binding
finds the library through SPARKMONO_LIB (tests/cli_python.sh sets it)."""
import os

import pytest

from smtest import ids_only, make_model


@pytest.fixture(scope="session")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("binding"))


@pytest.fixture(scope="session")
def model_dir(tmp):
    return make_model(os.path.join(tmp, "tiny"))


@pytest.fixture(scope="session")
def ids_dir(tmp, model_dir):
    return ids_only(model_dir, os.path.join(tmp, "tiny-ids"))


@pytest.fixture(scope="session")
def model(ids_dir):
    """The model without a tokenizer, opened."""
    import sparkmono

    with sparkmono.Model(ids_dir) as m:
        yield m
