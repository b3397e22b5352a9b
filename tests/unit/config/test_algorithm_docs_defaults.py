"""docs/algorithms.md states the defaults configs/ppo_trainer.yaml has, for every key its table lists."""

from __future__ import annotations

import re

from omegaconf import OmegaConf

from verl_like.config.loader import DEFAULT_CONFIG_DIR, compose_config

ROW = re.compile(r"^\| `([a-z_.]+)` \| `([^`]*)`")


def test_algorithm_docs_defaults_match_the_yaml():
    config = OmegaConf.to_container(compose_config([]), resolve=True)
    rows = [ROW.match(line).groups() for line in
            (DEFAULT_CONFIG_DIR.parent / "docs" / "algorithms.md").read_text().splitlines() if ROW.match(line)]
    assert len(rows) > 20
    wrong = []
    for key, documented in rows:
        node = config
        for part in (f"actor_rollout_ref.{key}" if key.startswith("actor.") else key).split("."):
            node = node.get(part) if isinstance(node, dict) and part in node else KeyError
        actual = "null" if node is None else str(node).lower()
        if actual != documented.lower():
            wrong.append(f"{key}: docs {documented}, yaml {'no such key' if node is KeyError else actual}")
    assert not wrong, wrong
