"""check_same_tokenizer: a model that reads the policy's token ids (reward model, critic, teacher) must have its
tokenizer; checked from the model directories before any worker starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_like.config.errors import ConfigError


def check_same_tokenizer(
    policy_tokenizer: Any,
    reward_model_path: str | Path,
    key: str = "reward_model.model.path",
    trust_remote_code: bool = False,
) -> None:
    """Raises ConfigError unless the model at `reward_model_path` has the policy's vocabulary and special tokens.

    The reward model scores the rollout's token ids as they are; with another tokenizer those ids would mean
    other text and the scores nothing. `key` names the config key in the message; trust_remote_code is passed to
    AutoTokenizer for that directory.
    """
    from transformers import AutoTokenizer  # only when a model directory is checked

    other = AutoTokenizer.from_pretrained(str(reward_model_path), trust_remote_code=trust_remote_code)
    mismatches = []
    if other.get_vocab() != policy_tokenizer.get_vocab():
        mismatches.append(f"vocabularies differ ({len(other)} vs the policy's {len(policy_tokenizer)} tokens)")
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        if getattr(other, name) != getattr(policy_tokenizer, name):
            mismatches.append(f"{name} {getattr(other, name)} vs the policy's {getattr(policy_tokenizer, name)}")
    if mismatches:
        raise ConfigError(
            f"{key}={str(reward_model_path)!r} has a tokenizer other than the policy's: {'; '.join(mismatches)}. "
            "verl_like feeds the rollout's token ids to that model unchanged, so it must share the policy's "
            "tokenizer; use a model fine-tuned from the policy's family (or re-tokenize in a custom reward function)"
        )
