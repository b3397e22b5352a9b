"""`verl_like.__version__` exists (verl's tutorial starts with `print(verl.__version__)`) and is pyproject's."""

import tomllib
from pathlib import Path

import verl_like


def test_version_is_the_one_pyproject_declares():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert verl_like.__version__ == pyproject["project"]["version"]
