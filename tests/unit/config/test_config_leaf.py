"""verl_like.config is a leaf: importing it starts no backend, and it imports nothing else of verl_like at module
level; the names it validates are the algorithm registries' names, a user's plugin included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import verl_like.config
from verl_like.config import ConfigError
from verl_like.config.algorithm import AlgorithmConfig
from verl_like.config.names import ADVANTAGE_ESTIMATOR_NAMES, KL_ESTIMATOR_NAMES, POLICY_LOSS_NAMES

CONFIG_DIR = Path(verl_like.config.__file__).parent
# Function-level imports that read model files or the machine, run only by those checks (never on import).
LAZY_ALLOWED = {
    ("loader.py", "verl_like.utils.device"),  # verl's defaults differ on a GPU machine
    ("loader.py", "verl_like.utils.hub"),  # HF hub ids -> local snapshots (check_paths)
    ("model.py", "verl_like.models.tiny"),  # tiny_spec's fields
    ("validate.py", "verl_like.data.synthetic"),  # synthetic:<task> names
    ("vision.py", "verl_like.data.synthetic"),  # whether a synthetic:<task> draws images
    ("validate.py", "verl_like.models.tiny"),  # the builtin tokenizer, compared with a critic's
    ("validate.py", "verl_like.engine.model_loading"),  # override_config against the model's HF config
}


def test_importing_config_starts_no_backend_and_no_other_package():
    code = (
        "import sys, verl_like.config\n"
        "print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.startswith('verl_like.') and not m.startswith('verl_like.config')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "[]"]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) of every `verl_like.*` import of a file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("verl_like"):
            found.append((node.module, id(node) in top))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, id(node) in top) for alias in node.names if alias.name.startswith("verl_like"))
    return found


def test_config_imports_only_config_modules_except_the_listed_file_checks():
    stray = []
    for path in sorted(CONFIG_DIR.glob("*.py")):
        for module, top_level in _imports(path):
            if module == "verl_like.config" or module.startswith("verl_like.config."):
                continue
            if top_level or (path.name, module) not in LAZY_ALLOWED:
                stray.append(f"{path.name}: {module}{' (module level)' if top_level else ''}")
    assert not stray, stray


def test_the_config_names_are_the_registries_names():
    from verl_like.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

    for names, registry in ((ADVANTAGE_ESTIMATOR_NAMES, ADVANTAGE_ESTIMATORS), (POLICY_LOSS_NAMES, POLICY_LOSSES),
                            (KL_ESTIMATOR_NAMES, KL_ESTIMATORS)):
        assert names.names() == registry.names()  # a built-in added or removed on one side only fails here


def test_a_plugin_registered_before_loading_validates(monkeypatch):
    from verl_like.algorithms import ADVANTAGE_ESTIMATORS, register_advantage_estimator

    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))  # no leak
    monkeypatch.setattr(ADVANTAGE_ESTIMATOR_NAMES, "_names", set(ADVANTAGE_ESTIMATOR_NAMES._names))
    with pytest.raises(ConfigError, match="algorithm.adv_estimator='my_estimator' is not a registered"):
        AlgorithmConfig(adv_estimator="my_estimator")
    register_advantage_estimator("my_estimator")(lambda inputs, config: inputs)
    assert AlgorithmConfig(adv_estimator="my_estimator").adv_estimator == "my_estimator"
