"""validate(config): the cross-field checks of a typed PPOConfig, run before Ray or any model starts.

Single-key checks (ranges, choices, registered names) run when each node is built (see `to_typed`); here are the
checks that need several keys, the filesystem or the model's config. Each raises one ConfigError naming the keys
and the fix; `validate` runs them all and reports every problem at once (one ConfigError listing each);
combinations that work but are probably unintended are returned (and logged) as warnings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from verl_like.config.agents import check_agent_loops
from verl_like.config.data import SUPPORTED_SUFFIXES, data_files, is_synthetic
from verl_like.config.distillation import check_distillation
from verl_like.config.derived import GROUP_ESTIMATORS, VALUE_ESTIMATORS, uses_critic
from verl_like.config.errors import ConfigError
from verl_like.config.lora import check_lora
from verl_like.config.placement import check_server_placement, check_weight_transfer
from verl_like.config.rollout_backends import check_rollout_package
from verl_like.config.pools import cluster_processes, cluster_summary
from verl_like.config.tokenizer_check import check_same_tokenizer
from verl_like.config.online_dpo import check_online_dpo
from verl_like.config.model import ModelConfig, is_builtin_model, max_position_embeddings, tiny_model_spec
from verl_like.config.ppo import PPOConfig

logger = logging.getLogger(__name__)


def validate(config: PPOConfig, *, check_paths: bool = True) -> list[str]:
    """Raises one ConfigError naming every inconsistent setting (each check's message; one line each when there
    are several); returns the warnings (also logged).

    check_paths: also require the model, tokenizer, data, reward-function and resume paths to exist (and the
    model's max_position_embeddings to be read from its config.json), and the rollout backend's package to be
    installed. Pass False to check a config for another
    machine (CI checks the GPU presets this way).
    """
    checks: list[Callable[[], object]] = [
        lambda: _check_lengths(config),
        lambda: _check_synthetic_specs(config),
        lambda: check_data_file_types(config),
        lambda: check_online_dpo(config),  # before _check_roles: its messages speak of the RL estimator
        lambda: check_distillation(config, check_paths),
        lambda: _check_roles(config),
        lambda: _check_megatron_runtime(config),
        lambda: check_lora(config),
        lambda: _check_fused_kernels(config),
        lambda: _check_reward_roles(config),
        lambda: _check_schedule(config),
        lambda: _check_cluster(config),
        lambda: check_server_placement(config),
        lambda: check_weight_transfer(config),
        lambda: _check_async(config),
        lambda: check_agent_loops(config, check_paths),
        lambda: config.derived,  # computes the per-rank sizes, raising if they do not divide
        *([lambda: _check_paths(config)] if check_paths else []),
        # This machine's packages, found and not imported (config/rollout_backends.py), before Ray starts.
        *([lambda: check_rollout_package(config.actor_rollout_ref.rollout.name, config.trainer.device)]
          if check_paths else []),
        lambda: _check_model_overrides(config, check_paths),
        lambda: _check_megatron_model_split(config, check_paths),
        lambda: _check_model_context(config, check_paths),
    ]
    errors: list[str] = []
    for check in checks:
        try:
            check()
        except ConfigError as err:
            if str(err) not in errors:  # later checks that read config.derived raise its error again
                errors.append(str(err))
        except Exception:
            if not errors:
                raise
            break  # a later check tripped over a setting already reported: report those
    if len(errors) == 1:
        raise ConfigError(errors[0])
    if errors:
        raise ConfigError(f"{len(errors)} problems with the config:\n" + "\n".join(f"- {e}" for e in errors))
    warnings = _warnings(config)
    for message in warnings:
        logger.warning("config: %s", message)
    return warnings


def data_file_type_errors(config: PPOConfig) -> list[str]:
    """One message per data file of a type the loader cannot read (existence is checked by _check_paths)."""
    return [
        f"{key}: {path!r} is a {Path(path).suffix or 'suffix-less'} file; verl_like reads "
        f"{' and '.join(SUPPORTED_SUFFIXES)} (examples/data_preprocess/ writes parquet), or 'synthetic:<task>'"
        for key, path in data_files(config.data) if Path(path).suffix not in SUPPORTED_SUFFIXES
    ]


def check_data_file_types(config: PPOConfig) -> None:
    """Raises ConfigError naming the data files of a type the loader cannot read."""
    errors = data_file_type_errors(config)
    if errors:
        raise ConfigError("; ".join(errors))


def _check_async(config: PPOConfig) -> None:
    async_training = config.async_training
    if not async_training.enable:
        return
    if not config.placement.uses_servers:
        raise ConfigError(
            "async_training.enable=true overlaps generation with the update, which needs the rollout in its own "
            "processes: set actor_rollout_ref.rollout.mode=server (the colocated engine shares the trainer's process)"
        )
    if config.algorithm.filter_groups.enable:
        raise ConfigError(
            "async_training.enable=true with algorithm.filter_groups.enable=true is not supported (dynamic sampling "
            "draws a variable number of batches); turn one of them off"
        )


def _check_lengths(config: PPOConfig) -> None:
    data, rollout = config.data, config.actor_rollout_ref.rollout
    if rollout.response_length != data.max_response_length:
        raise ConfigError(
            f"actor_rollout_ref.rollout.response_length={rollout.response_length} differs from "
            f"data.max_response_length={data.max_response_length}; set only data.max_response_length (the default "
            "YAML interpolates the rollout's from it)"
        )
    if rollout.prompt_length < data.max_prompt_length:
        raise ConfigError(
            f"actor_rollout_ref.rollout.prompt_length={rollout.prompt_length} is below data.max_prompt_length="
            f"{data.max_prompt_length}, so the engine would reject the longest prompts; set only "
            "data.max_prompt_length (the default YAML interpolates the rollout's from it)"
        )
    overlong = config.reward_model.overlong_buffer
    if overlong.enable and overlong.len > data.max_response_length:
        raise ConfigError(
            f"reward_model.overlong_buffer.len={overlong.len} exceeds data.max_response_length="
            f"{data.max_response_length}; set it to at most {data.max_response_length} (DAPO uses a quarter)"
        )


def _check_synthetic_specs(config: PPOConfig) -> None:
    from verl_like.data.synthetic import parse_synthetic_spec

    for key, files in (("data.train_files", config.data.train_files), ("data.val_files", config.data.val_files)):
        for path in files:
            if is_synthetic(path):
                try:
                    parse_synthetic_spec(path)
                except ValueError as err:
                    raise ConfigError(f"{key}: {err}") from err
    from verl_like.config.vision import check_vision_options, synthetic_image_task

    if any(is_synthetic(path) and synthetic_image_task(path) for path in config.data.train_files):
        check_vision_options(config)


def _check_roles(config: PPOConfig) -> None:
    algo, n = config.algorithm, config.actor_rollout_ref.rollout.n
    if algo.adv_estimator in VALUE_ESTIMATORS and not uses_critic(config):
        raise ConfigError(
            f"algorithm.adv_estimator={algo.adv_estimator!r} needs a critic (value estimates), but critic.enable="
            "false; set critic.enable=true (or null), or pick a critic-free estimator such as grpo"
        )
    if algo.adv_estimator in GROUP_ESTIMATORS and n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={algo.adv_estimator!r} compares the samples of one prompt, but "
            f"actor_rollout_ref.rollout.n={n} gives every advantage 0; set actor_rollout_ref.rollout.n >= 2"
        )
    if algo.filter_groups.enable and n < 2:
        raise ConfigError(
            f"algorithm.filter_groups.enable=true keeps groups whose samples differ, but actor_rollout_ref.rollout.n="
            f"{n} makes every group a single sample; set actor_rollout_ref.rollout.n >= 2"
        )
    if config.trainer.critic_warmup > 0 and not uses_critic(config):
        raise ConfigError(
            f"trainer.critic_warmup={config.trainer.critic_warmup} needs a critic, but none runs (adv_estimator="
            f"{algo.adv_estimator!r}, critic.enable={config.critic.enable}); set trainer.critic_warmup=0"
        )


def _check_megatron_runtime(config: PPOConfig) -> None:
    """What a megatron role cannot do on this run: bf16 compute off CUDA (Megatron's mixed-precision optimizer),
    checkpoints of the distributed optimizer (not written yet)."""
    nodes = [("actor_rollout_ref.actor", config.actor_rollout_ref.actor)]
    if uses_critic(config):
        nodes.append(("critic", config.critic))
    for prefix, node in nodes:
        if node.strategy != "megatron":
            continue
        if node.megatron.use_distributed_optimizer and config.trainer.save_freq > 0:
            raise ConfigError(
                f"{prefix}.megatron.use_distributed_optimizer=true cannot be checkpointed yet (its sharded optimizer "
                f"state is not saved), and trainer.save_freq={config.trainer.save_freq} asks for checkpoints; set "
                f"{prefix}.megatron.use_distributed_optimizer=false or trainer.save_freq=-1"
            )
        if config.trainer.device != "cuda" and node.fsdp_config.param_dtype == "bfloat16":
            raise ConfigError(
                f"{prefix}.fsdp_config.param_dtype=bfloat16 with {prefix}.strategy=megatron needs CUDA (Megatron's "
                f"mixed-precision optimizer checks for CUDA tensors); on trainer.device={config.trainer.device} set "
                f"{prefix}.fsdp_config.param_dtype=float32"
            )


def _check_fused_kernels(config: PPOConfig) -> None:
    if config.actor_rollout_ref.actor.use_fused_kernels and config.trainer.device != "cuda":
        raise ConfigError(
            f"actor_rollout_ref.model.use_fused_kernels=true runs Triton kernels on CUDA, but trainer.device="
            f"{config.trainer.device}; set actor_rollout_ref.model.use_fused_kernels=false"
        )


def _check_schedule(config: PPOConfig) -> None:
    trainer, data = config.trainer, config.data
    if not data.val_files and (trainer.test_freq > 0 or trainer.val_before_train):
        raise ConfigError(
            f"trainer.test_freq={trainer.test_freq} / trainer.val_before_train={trainer.val_before_train} ask for "
            "validation but data.val_files is empty; set data.val_files, or trainer.test_freq=-1 and "
            "trainer.val_before_train=false"
        )
    if trainer.log_val_generations and not data.val_files:
        raise ConfigError("trainer.log_val_generations > 0 needs data.val_files; set them or log_val_generations=0")


def _check_reward_roles(config: PPOConfig) -> None:
    rm, filters = config.reward_model, config.algorithm.filter_groups
    if filters.enable and filters.metric == "acc" and rm.enable and rm.combine == "replace":
        raise ConfigError(
            "algorithm.filter_groups.metric='acc' compares the rule scorer's score, but reward_model.combine="
            "'replace' never runs the rule scorers; set algorithm.filter_groups.metric=score or "
            "reward_model.combine=add"
        )


def _check_cluster(config: PPOConfig) -> None:
    trainer = config.trainer
    joins_cluster = trainer.ray_address not in (None, "local") or bool(os.environ.get("RAY_ADDRESS"))
    if trainer.nnodes > 1 and not joins_cluster:
        raise ConfigError(
            f"trainer.nnodes={trainer.nnodes} needs a running multi-node Ray cluster; set trainer.ray_address=auto "
            "(or export RAY_ADDRESS) on a node of that cluster"
        )
    num_cpus = trainer.ray_init.num_cpus
    processes, _ = cluster_processes(config)
    needed = processes * trainer.cpus_per_worker
    if not joins_cluster and num_cpus is not None and num_cpus < needed:
        raise ConfigError(
            f"trainer.ray_init.num_cpus={num_cpus} cannot place {processes} processes ({cluster_summary(config)}) x "
            f"trainer.cpus_per_worker={trainer.cpus_per_worker:g} = {needed:g} CPUs; raise num_cpus or lower "
            "cpus_per_worker"
        )


def _require_dir(key: str, path: str, what: str) -> None:
    if not Path(path).expanduser().is_dir():
        raise ConfigError(f"{key}={path!r}: no such directory; point it at {what}")


def _check_paths(config: PPOConfig) -> None:
    model = config.actor_rollout_ref.model
    if not model.is_builtin:
        _require_dir("actor_rollout_ref.model.path", model.path, "a local HF model directory (or use 'tiny')")
        if not (Path(model.path).expanduser() / "config.json").is_file():
            raise ConfigError(
                f"actor_rollout_ref.model.path={model.path!r} has no config.json; point it at a HF model directory"
            )
    if model.tokenizer_path and not is_builtin_model(model.tokenizer_path):
        _require_dir("actor_rollout_ref.model.tokenizer_path", model.tokenizer_path, "a local tokenizer directory")
    critic_path = config.critic.model.path
    if uses_critic(config) and critic_path and not is_builtin_model(critic_path):
        _require_dir("critic.model.path", critic_path, "a local HF model directory (null: the actor's)")
    for key, path in data_files(config.data):
        if not Path(path).expanduser().is_file():
            raise ConfigError(
                f"{key}: {path!r} does not exist; give parquet/jsonl files (see examples/data_preprocess/) or "
                "'synthetic:<task>'"
            )
    reward_fn = config.custom_reward_function.path
    if reward_fn and not Path(reward_fn).expanduser().is_file():
        raise ConfigError(f"custom_reward_function.path={reward_fn!r} does not exist; point it at a Python file")
    if config.reward_model.enable:
        _require_dir("reward_model.model.path", str(config.reward_model.model.path), "a local reward-model directory")
        _check_reward_model_tokenizer(config)
    if uses_critic(config):
        _check_critic_tokenizer(config)
    resume = config.trainer.resume_from_path
    if config.trainer.resume_mode == "resume_path" and resume:
        _require_dir("trainer.resume_from_path", resume, "a global_step_N checkpoint folder")


def _tokenizer(path: str, trust_remote_code: bool) -> object:
    """The tokenizer at `path` (the builtin tiny one for 'tiny')."""
    if is_builtin_model(path):
        from verl_like.models.tiny import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(path).expanduser()), trust_remote_code=trust_remote_code)


def _policy_tokenizer(config: PPOConfig) -> object:
    model = config.actor_rollout_ref.model
    return _tokenizer(model.tokenizer_path or model.path, model.trust_remote_code)


def _check_reward_model_tokenizer(config: PPOConfig) -> None:
    """The reward model scores the rollout's token ids, so it must have the policy's tokenizer."""
    rm_model = config.reward_model.model
    check_same_tokenizer(
        _policy_tokenizer(config), str(Path(str(rm_model.path)).expanduser()),
        trust_remote_code=rm_model.trust_remote_code,
    )


def _check_critic_tokenizer(config: PPOConfig) -> None:
    """The critic reads the actor's token ids, so critic.model.tokenizer_path (else a critic.model.path of its
    own) must hold the policy's tokenizer."""
    critic, actor = config.critic.model, config.actor_rollout_ref.model
    if critic.tokenizer_path:
        key, path = "critic.model.tokenizer_path", critic.tokenizer_path
    elif critic.path and critic.path != actor.path:
        key, path = "critic.model.path", critic.path
    else:
        return
    if is_builtin_model(path):
        if is_builtin_model(actor.tokenizer_path or actor.path):
            return
        raise ConfigError(
            f"{key}={path!r} is the builtin tiny tokenizer but actor_rollout_ref.model uses "
            f"{actor.tokenizer_path or actor.path!r}; the critic reads the actor's token ids, so leave {key} null "
            "(the actor's tokenizer)"
        )
    _require_dir(key, path, "a local directory holding the policy's tokenizer")
    try:
        check_same_tokenizer(
            _policy_tokenizer(config), str(Path(path).expanduser()), key=key, trust_remote_code=critic.trust_remote_code
        )
    except ConfigError:
        raise
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{key}={path!r}: no tokenizer could be loaded ({err}); the critic reads the actor's token ids, so set "
            "critic.model.tokenizer_path to a directory with the policy's tokenizer, or leave it null"
        ) from err


def _hf_config_of(path: str, trust_remote_code: bool, key: str) -> object:
    """The HF config of the model at `path` ('tiny': a default Qwen2Config, the builtin model's class)."""
    from transformers import AutoConfig, Qwen2Config

    if is_builtin_model(path):
        return Qwen2Config()
    try:
        return AutoConfig.from_pretrained(str(Path(path).expanduser()), trust_remote_code=trust_remote_code)
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise ConfigError(
                f"{key}={path!r} ships its own model code; set {key.rsplit('.', 1)[0]}.trust_remote_code=true to "
                "run it"
            ) from err
        raise ConfigError(f"{key}={path!r}: its config.json does not load: {err}") from err


def _check_model_overrides(config: PPOConfig, check_paths: bool) -> None:
    """Every override_config entry must name a field of the model's HF config (read when the model is here)."""
    from verl_like.engine.model_loading import apply_config_overrides

    actor = config.actor_rollout_ref.model
    models = [("actor_rollout_ref.model", actor.path, actor)]
    if uses_critic(config):
        models.append(("critic.model", config.critic.model.path or actor.path, config.critic.model))
    for prefix, path, model in models:
        if not model.override_config or not (check_paths or is_builtin_model(path)):
            continue
        hf_config = _hf_config_of(path, model.trust_remote_code, f"{prefix}.path")
        try:
            apply_config_overrides(hf_config, model.override_config, f"{prefix}.override_config")
        except ValueError as err:
            raise ConfigError(str(err)) from err


def _model_split_sizes(path: str, key: str, trust_remote_code: bool, overrides: Mapping[str, Any],
                       policy: ModelConfig) -> tuple[int, int]:
    """(num_hidden_layers, num_key_value_heads) of the model at `path` (the builtin tiny one: the policy's
    tiny_spec), with its override_config applied (it may change either)."""
    if is_builtin_model(path):
        spec = tiny_model_spec(policy)
        layers, kv_heads = spec.num_hidden_layers, spec.num_key_value_heads
    else:
        hf_config = _hf_config_of(path, trust_remote_code, key)
        layers = hf_config.num_hidden_layers
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    return int(overrides.get("num_hidden_layers", layers)), int(overrides.get("num_key_value_heads", kv_heads))


def _check_megatron_model_split(config: PPOConfig, check_paths: bool) -> None:
    """A megatron role's TP must divide the model's KV heads and its layers split into PP x VPP equal chunks."""
    arr, topology = config.actor_rollout_ref, config.derived.topology
    policy, critic = arr.model, config.critic
    policy_model = ("actor_rollout_ref.model.path", policy.path, policy.trust_remote_code, policy.override_config)
    roles = [("actor_rollout_ref.actor", arr.actor.strategy, arr.actor.megatron, policy_model)]
    if topology.ref is not None:
        roles.append(("actor_rollout_ref.ref", str(arr.ref.strategy), arr.ref.megatron or arr.actor.megatron,
                      policy_model))
    if topology.critic is not None:
        critic_model = ("critic.model.path", critic.model_path(policy), critic.model.trust_remote_code,
                        critic.model.override_config)
        roles.append((critic.PREFIX, critic.strategy, critic.megatron, critic_model))
    for prefix, strategy, megatron, (key, path, trust, overrides) in roles:
        if strategy != "megatron" or not (check_paths or is_builtin_model(path)):
            continue
        layers, kv_heads = _model_split_sizes(path, key, trust, overrides, policy)
        try:
            megatron.check_model(prefix, layers, kv_heads)
        except ValueError as err:
            raise ConfigError(f"{err} ({key}={path!r}: {layers} layers, {kv_heads} key/value heads)") from err


def _check_model_context(config: PPOConfig, check_paths: bool) -> None:
    """prompt + response must fit the model's max_position_embeddings (read when the model is on this machine)."""
    model = config.actor_rollout_ref.model
    if not model.is_builtin and not check_paths:
        return
    limit = max_position_embeddings(model)
    if limit is None:
        return
    data = config.data
    total = data.max_prompt_length + data.max_response_length
    if total > limit:
        raise ConfigError(
            f"data.max_prompt_length={data.max_prompt_length} + data.max_response_length={data.max_response_length} "
            f"= {total} exceeds the model's max_position_embeddings={limit} (actor_rollout_ref.model.path="
            f"{model.path!r}); shorten them or raise the model's limit"
        )


def _warnings(config: PPOConfig) -> list[str]:
    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    warnings = []
    if algo.use_kl_in_reward and actor.use_kl_loss:
        warnings.append(
            "algorithm.use_kl_in_reward=true and actor_rollout_ref.actor.use_kl_loss=true both penalise the KL to "
            "the reference, so it is counted twice; usually one of them is meant"
        )
    if config.async_training.staleness > 0 and not algo.rollout_is:
        warnings.append(
            f"async_training.staleness={config.async_training.staleness} trains on samples of older policies without "
            "an importance correction; set algorithm.rollout_is=true to weight each token by old/rollout "
            "probability (truncated at algorithm.rollout_is_threshold)"
        )
    if config.critic.enable and algo.adv_estimator not in VALUE_ESTIMATORS:
        warnings.append(
            f"critic.enable=true trains a critic that algorithm.adv_estimator={algo.adv_estimator!r} does not use; "
            "set critic.enable=null to run it only when needed"
        )
    return warnings
