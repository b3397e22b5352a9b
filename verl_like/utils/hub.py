"""Hugging Face hub ids as model paths: `actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct` resolves to the
snapshot directory in the HF cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).

With HF_HUB_OFFLINE=1 (verl_like's default, kept if you set it yourself) only the cache is read; with
HF_HUB_OFFLINE=0 a missing model is downloaded into the cache. Both variables are read at call time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Config keys that name a model directory, as (path through the config, dotted key for messages).
MODEL_PATH_KEYS = (
    (("actor_rollout_ref", "model", "path"), "actor_rollout_ref.model.path"),
    (("actor_rollout_ref", "model", "tokenizer_path"), "actor_rollout_ref.model.tokenizer_path"),
    (("critic", "model", "path"), "critic.model.path"),
    (("critic", "model", "tokenizer_path"), "critic.model.tokenizer_path"),
    (("reward_model", "model", "path"), "reward_model.model.path"),
)


def is_hub_id(path: str) -> bool:
    """True for `org/name` that is not an existing local path."""
    return bool(_HUB_ID.match(path)) and not Path(path).expanduser().exists()


def hub_cache_dir() -> Path:
    """The HF hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def resolve_hub_model(path: str, key: str = "model path") -> str:
    """The local directory of `path`: itself, or the cached (or, online, downloaded) snapshot of a hub id."""
    if not is_hub_id(path):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    cache = hub_cache_dir()
    try:
        local = snapshot_download(path, cache_dir=str(cache), local_files_only=offline)
    except LocalEntryNotFoundError as err:
        raise FileNotFoundError(
            f"{key}={path}: not in the HF cache {cache} and HF_HUB_OFFLINE=1; download it first "
            f"(`huggingface-cli download {path}` with the same HF_HOME), run with HF_HUB_OFFLINE=0, or set {key} "
            "to a local directory"
        ) from err
    logger.info("%s=%s: using %s", key, path, local)
    return local


def resolve_hub_models(config: Any) -> Any:
    """`config` (a frozen PPOConfig) with every hub id in MODEL_PATH_KEYS replaced by its local snapshot."""
    from verl_like.config.errors import ConfigError

    for fields, key in MODEL_PATH_KEYS:
        nodes = [config]
        for name in fields[:-1]:
            nodes.append(getattr(nodes[-1], name))
        value = getattr(nodes[-1], fields[-1])
        if not value or not is_hub_id(value):
            continue
        try:
            replacement: Any = resolve_hub_model(value, key)
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None
        for node, name in zip(reversed(nodes), reversed(fields)):
            replacement = dataclasses.replace(node, **{name: replacement})
        config = replacement
    return config
