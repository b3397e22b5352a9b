"""Composing configs/ppo_trainer.yaml with Hydra, and turning the result into a typed, validated PPOConfig.

    cfg = compose_config(["+trainer=gsm8k_grpo_qwen2_5_0_5b", "data.train_batch_size=64"])
    config = to_typed(cfg)        # frozen dataclasses; unknown keys and wrong types raise ConfigError
    validate(config)              # cross-field checks (verl_like/config/validate.py)

`load_config(overrides)` does all three. `+trainer=NAME` adds the preset configs/trainer/NAME.yaml, which
starts with `# @package _global_` and so may set any key; command-line overrides apply after it.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from verl_like.config.convert import build_node, unknown_key_message, valid_keys
from verl_like.config.errors import ConfigError
from verl_like.config.fused_kernels import resolve_fused_kernels
from verl_like.config.old_log_prob import resolve_old_log_prob
from verl_like.config.rollout_log_probs import resolve_calculate_log_probs
from verl_like.config.ppo import PPOConfig
from verl_like.config.validate import validate

logger = logging.getLogger(__name__)

CONFIG_NAME = "ppo_trainer"
PRESET_GROUP = "trainer"
# configs/ lives at the repository root, two levels above this package.
DEFAULT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def config_dir_path(config_dir: str | os.PathLike | None = None) -> Path:
    """The configs/ folder: `config_dir`, else $VERL_LIKE_CONFIG_DIR, else the repository's configs/."""
    path = Path(config_dir or os.environ.get("VERL_LIKE_CONFIG_DIR") or DEFAULT_CONFIG_DIR).expanduser().resolve()
    if not (path / f"{CONFIG_NAME}.yaml").is_file():
        raise ConfigError(
            f"no {CONFIG_NAME}.yaml in {path}; pass config_dir= (or set VERL_LIKE_CONFIG_DIR) to the folder holding "
            "verl_like's configs/"
        )
    return path


def list_presets(config_dir: str | os.PathLike | None = None) -> list[str]:
    """Names usable as `+trainer=NAME`: the YAML files in configs/trainer/."""
    folder = config_dir_path(config_dir) / PRESET_GROUP
    return sorted(p.stem for p in folder.glob("*.yaml"))


def compose_config(overrides: Sequence[str] = (), config_dir: str | os.PathLike | None = None) -> DictConfig:
    """configs/ppo_trainer.yaml composed with `overrides` (Hydra syntax: `a.b=1`, `+trainer=NAME`).

    Works inside or outside a running Hydra app (the global Hydra state is restored afterwards). A key that does
    not exist raises ConfigError naming the closest valid key; an unknown preset names the available ones.
    """
    folder = config_dir_path(config_dir)
    overrides = verl_overrides(overrides)
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
            return compose(config_name=CONFIG_NAME, overrides=list(overrides))
    except MissingConfigException as err:
        raise _missing_preset_error(err, overrides, folder) from err
    except HydraException as err:
        raise _composition_error(err) from err
    finally:
        restore_gh_from_backup(backup)


def verl_overrides(overrides: Sequence[str]) -> list[str]:
    """`overrides` with verl's forms translated and, for a job that names data or a model without a preset,
    verl's defaults underneath (verl_like/config/verl_compat.py); logs what it changed."""
    from verl_like.config.verl_compat import translate_overrides, verl_default_layer
    from verl_like.utils.device import is_cuda_available

    translated, notes = translate_overrides(overrides)
    for note in notes:
        logger.info("verl key: %s", note)
    device = _last_value(translated, "trainer.device")
    layer = verl_default_layer(translated, cuda=device == "cuda" or (device in (None, "auto") and is_cuda_available()))
    if layer:
        logger.warning(
            "this command names its own data/model: keys it leaves unset take verl's defaults (%s: estimator gae, "
            "rollout.n=1, total_epochs honoured, device from the hardware), not the embedded CPU demo's; add "
            "+trainer=default_task to build on the demo instead", ", ".join(layer),
        )
    return [*layer, *translated]


def _last_value(overrides: Sequence[str], key: str) -> str | None:
    """The value the last `key=value` of `overrides` sets (quotes stripped), else None."""
    values = [o.partition("=")[2].strip("'\"") for o in overrides if o.lstrip("+").partition("=")[0] == key]
    return values[-1] if values else None


def _missing_preset_error(err: MissingConfigException, overrides: Sequence[str], folder: Path) -> ConfigError:
    presets = list_presets(folder)
    for override in overrides:
        key, _, name = override.lstrip("+~").partition("=")
        if key == PRESET_GROUP and name not in presets:
            close = difflib.get_close_matches(name, presets, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            return ConfigError(
                f"+{PRESET_GROUP}={name}: no preset configs/{PRESET_GROUP}/{name}.yaml; {hint}"
                f"available presets: {', '.join(presets)}"
            )
    return ConfigError(str(err))


def _composition_error(err: HydraException) -> ConfigError:
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and getattr(cause, "full_key", None):
            return ConfigError(
                unknown_key_message(str(cause.full_key), valid_keys(PPOConfig))
                + " (to add an entry under a free-form mapping such as override_config, prefix it with '+')"
            )
        cause = cause.__cause__
    return ConfigError(f"could not compose the config: {err}")


def resolve_auto_device(cfg: DictConfig) -> DictConfig:
    """`cfg` with trainer.device=auto replaced by the device it means here (cuda when torch sees a usable GPU,
    else cpu), once, before any check reads it (use_fused_kernels, the preflight's GPU count)."""
    if OmegaConf.select(cfg, "trainer.device") == "auto":
        from verl_like.utils.device import resolve_device

        cfg.trainer.device = resolve_device("auto")
        logger.info("trainer.device=auto: %s here", cfg.trainer.device)
    return cfg


def to_typed(cfg: DictConfig | Mapping[str, Any]) -> PPOConfig:
    """The frozen PPOConfig of a composed config (interpolations resolved).

    Raises ConfigError for an unknown key (naming the closest valid key), a wrong type (naming key, value and the
    expected type), a required value left at `???`, or a value a node rejects.
    """
    if isinstance(cfg, DictConfig):
        try:
            container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except MissingMandatoryValue as err:
            raise ConfigError(f"{err.full_key} is required but left at '???'; set it") from err
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "config"
            raise ConfigError(f"{key}: {err.msg if hasattr(err, 'msg') else err}") from err
    else:
        container = cfg
    return build_node(PPOConfig, container, "", valid_keys(PPOConfig))


def load_config(
    overrides: Sequence[str] = (), config_dir: str | os.PathLike | None = None, *, check_paths: bool = True
) -> PPOConfig:
    """compose_config + to_typed + validate: the validated PPOConfig of `overrides`. With check_paths, HF hub ids
    given as model paths are resolved to their snapshot in the HF cache first (verl_like/utils/hub.py). A null
    use_fused_kernels, recompute_old_log_prob and calculate_log_probs are decided here, once
    (config/fused_kernels.py, config/old_log_prob.py, config/rollout_log_probs.py)."""
    config = to_typed(resolve_auto_device(compose_config(overrides, config_dir)))
    if check_paths:
        from verl_like.utils.hub import resolve_hub_models

        config = resolve_hub_models(config)
    config = resolve_calculate_log_probs(resolve_old_log_prob(resolve_fused_kernels(config)))
    validate(config, check_paths=check_paths)
    return config
