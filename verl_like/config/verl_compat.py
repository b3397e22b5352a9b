"""verl's command lines as they are: the keys and value forms verl accepts, translated before Hydra composes.

`translate_overrides(overrides)` returns the overrides verl_like composes, and notes to log (the dry run prints
them); every refusal of one command line is raised at once, in one ConfigError:
- verl's Hydra flags: `--config-name=ppo_megatron_trainer` sets the megatron strategy of the actor and critic,
  `--config-path` is dropped; Megatron keys without a megatron strategy are refused (they would be unused);
- `trainer.logger=console` (a string) becomes the list `[console]`; `+key=` of a key verl_like has reads as `++key=`;
- `trainer.default_hdfs_dir=null` is dropped; a path is refused (no HDFS copy here);
- `*.optim.warmup_style` (deprecated in verl) becomes `*.optim.lr_scheduler_type`;
- deprecated global micro-batch keys (`ppo_micro_batch_size`, `log_prob_micro_batch_size`, ...) are refused with
  the `_per_gpu` key to set instead (null is dropped);
- performance keys are taken where they mean what runs and refused otherwise, each with its reason
  (PERFORMANCE_KEYS below);
- the keys of verl_like/config/verl_keys.py: renamed to ours, taken and ignored with their reason, or refused;
- DAPO's `data.gen_batch_size` scales `algorithm.filter_groups.max_num_gen_batches`, and its
  `reward_kwargs.max_resp_len` must equal `data.max_response_length`.

`verl_default_layer(overrides)`: when a command names data or a model and no preset, the keys it leaves unset take
verl's documented defaults (configs/trainer/verl.yaml, plus bf16 on a GPU) instead of the embedded CPU toy job's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_like.config.errors import ConfigError
from verl_like.config.rollout_backends import NAME_KEY, ROLLOUT_BACKENDS

logger = logging.getLogger(__name__)

VERL_PRESET = "verl"
# Keys whose presence means "this is my job", not the embedded default task.
USER_JOB_KEYS = ("data.train_files", "actor_rollout_ref.model.path")
# On a GPU verl trains in bf16 (fp32 master weights and reductions) and rolls out in bf16.
VERL_CUDA_OVERRIDES = (
    "actor_rollout_ref.rollout.dtype=bfloat16",
    "actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16",
    "actor_rollout_ref.actor.fsdp_config.reduce_dtype=float32",
    "actor_rollout_ref.ref.fsdp_config.param_dtype=bfloat16",
    "critic.fsdp_config.param_dtype=bfloat16",
    "critic.fsdp_config.reduce_dtype=float32",
    "trainer.n_gpus_per_node=8",
    "trainer.ray_init.num_cpus=null",  # Ray counts the machine's CPUs, as on the GPU presets
)
# verl's deprecated global micro-batch keys -> the per-GPU key that replaced them.
DEPRECATED_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
}
# key -> (values taken as they are, why other values are refused / what the taken values mean)
PERFORMANCE_KEYS = {
    "actor_rollout_ref.actor.use_torch_compile": (
        ("false", "False"), "the FSDP engine runs eagerly (torch.compile of the FSDP2 model is not built); set it false or remove it"),
    "actor_rollout_ref.ref.use_torch_compile": (
        ("false", "False"), "the reference runs eagerly (torch.compile is not built); set it false or remove it"),
    "actor_rollout_ref.rollout.enable_chunked_prefill": (
        None, "vLLM's V1 engine chunks long prefills (verl's default, true); where a prefill is split changes the "
        "scheduling only, not the samples, so false is taken and ignored"),
    "data.dataloader_num_workers": (
        None, "prompts are tokenized once into memory, so the loader needs no worker processes; the value is unused"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": (
        ("1",), "Ulysses sequence parallelism is not built; only 1 (none) runs"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": (
        ("1",), "Ulysses sequence parallelism is not built; only 1 (none) runs"),
    "critic.ulysses_sequence_parallel_size": (
        ("1",), "Ulysses sequence parallelism is not built; only 1 (none) runs"),
}
_NULL = ("null", "None", "~", "")


def _split(override: str) -> tuple[str, str, str] | None:
    """(prefix '+'/'++'/'', key, value) of a `key=value` override; None for a preset or deletion."""
    if "=" not in override or override.startswith("~"):
        return None
    key, _, value = override.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+"))]
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return prefix, key.lstrip("+"), value


MEGATRON_CONFIG = "ppo_megatron_trainer"
# verl's Megatron entry point sets every trained role's strategy; the reference follows the actor's.
MEGATRON_STRATEGIES = ("actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron")
_HYDRA_FLAGS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn")


def _hydra_flags(overrides: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """`overrides` without Hydra's `--config-path/--config-name` flags (either `--flag=v` or `--flag v`), and them."""
    rest: list[str] = []
    flags: dict[str, str] = {}
    args = list(overrides)
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        if name in _HYDRA_FLAGS:
            if not sep and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            flags[name.lstrip("-").replace("cp", "config-path").replace("cn", "config-name")] = value.strip("'\"")
        else:
            rest.append(args[i])
        i += 1
    return rest, flags


def _config_name_layer(flags: dict[str, str], errors: list[str], notes: list[str]) -> list[str]:
    """The overrides verl's `--config-name` stands for (its `--config-path` is verl's own folder: dropped)."""
    if "config-path" in flags:
        notes.append(f"--config-path={flags['config-path']}: verl's config folder; verl_like composes its own "
                     "configs/ppo_trainer.yaml")
    name = flags.get("config-name", "").removesuffix(".yaml")
    if not name or name == "ppo_trainer":
        return []
    if name == MEGATRON_CONFIG:
        notes.append(f"--config-name={MEGATRON_CONFIG}: read as {' '.join(MEGATRON_STRATEGIES)} (the reference "
                     "follows the actor)")
        return list(MEGATRON_STRATEGIES)
    layered = _user_config_file(flags, errors, notes)
    if layered is not None:
        return layered
    errors.append(f"--config-name={flags['config-name']}: verl_like has the PPO trainer's config only "
                  f"(ppo_trainer, or {MEGATRON_CONFIG} for strategy=megatron), and no {name}.yaml built on it was "
                  "found under --config-path; remove the flag or use one of them")
    return []


def _user_config_file(flags: dict[str, str], errors: list[str], notes: list[str]) -> list[str] | None:
    """A user's config file (`--config-path=DIR --config-name=NAME`, DIR/NAME.yaml) whose Hydra defaults are verl's
    ppo_trainer or ppo_megatron_trainer (and _self_), as verl's multi-turn examples write them: its keys as
    overrides placed before the command line's (which win, as in Hydra). None when there is no such file."""
    import yaml

    name = flags["config-name"].removesuffix(".yaml")
    path = Path(flags.get("config-path", ".")).expanduser() / f"{name}.yaml"
    if not path.is_file():
        return None
    body = yaml.safe_load(path.read_text()) or {}
    defaults = [d for d in body.pop("defaults", []) if d != "_self_"]
    body.pop("hydra", None)
    bases = {"ppo_trainer": [], MEGATRON_CONFIG: list(MEGATRON_STRATEGIES)}
    if len(defaults) != 1 or not isinstance(defaults[0], str) or defaults[0] not in bases:
        errors.append(f"--config-name={name}: {path} builds on {defaults or 'no defaults'}; verl_like reads a "
                      f"config file only when its defaults are [ppo_trainer or {MEGATRON_CONFIG}, _self_]")
        return []
    overrides = [*bases[defaults[0]], *(f"{key}={_override_value(value)}" for key, value in _leaves(body))]
    notes.append(f"--config-name={name}: {path} read as {len(overrides)} overrides on {defaults[0]}, before the "
                 "command line's")
    return overrides


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), node)]


def _override_value(value: Any) -> str:
    """A YAML value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text.startswith("${") or (text and all(c.isalnum() or c in "_-./:" for c in text)):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _translate_one(prefix: str, key: str, value: str, out: list[str], notes: list[str]) -> None:
    """Appends the verl_like form of one `key=value` to `out` (or nothing); raises ConfigError to refuse it."""
    from verl_like.config import verl_keys

    if key == "trainer.logger" and not value.startswith("["):
        out.append(f"{prefix}trainer.logger=[{value}]")
    elif key == "trainer.default_hdfs_dir":
        if value not in _NULL:
            raise ConfigError(
                f"trainer.default_hdfs_dir={value}: checkpoints are not copied to HDFS; remove the key and set "
                "trainer.default_local_dir to storage every node mounts"
            )
    elif key.endswith(".optim.warmup_style"):
        new_key = key.replace("warmup_style", "lr_scheduler_type")
        out.append(f"{prefix}{new_key}={value}")
        notes.append(f"{key} is deprecated in verl; read as {new_key}={value}")
    elif key in DEPRECATED_KEYS:
        pass  # verl's global micro-batch sizes: per GPU once the command's GPU count is known (_per_gpu_micro)
    elif key in PERFORMANCE_KEYS:
        taken, reason = PERFORMANCE_KEYS[key]
        if taken is not None and value not in taken:
            raise ConfigError(f"{key}={value} is not supported: {reason}")
        notes.append(f"{key}={value}: {reason}")
    elif value in verl_keys.RENAMED_VALUES.get(key, {}):
        new_value = verl_keys.RENAMED_VALUES[key][value]
        out.append(f"{prefix}{key}={new_value}")
        notes.append(f"{key}={value}: verl's name; read as {key}={new_value}")
    elif key in verl_keys.REFUSED_VALUES:
        refused, reason, instead = verl_keys.REFUSED_VALUES[key]
        # A backend someone registered (config/rollout_backends.py) is no longer refused.
        if value in refused and not (key == NAME_KEY and value in ROLLOUT_BACKENDS):
            raise ConfigError(f"{key}={value} is not supported: {reason}; {instead}")
        out.append(f"{prefix}{key}={value}")
    elif (new_key := verl_keys.renamed(key)) is not None:
        out.append(f"{new_key}={value}")
        notes.append(f"{key}={value}: verl's name; read as {new_key}={value}")
    elif (entry := verl_keys.taken_key(key)) is not None:
        if entry.taken is not None and verl_keys.normalized(value) not in entry.taken:
            raise ConfigError(f"{key}={value} is not supported: {entry.reason}; {entry.instead}")
        notes.append(f"{key}={value}: ignored, {entry.reason}")
    else:
        # verl's scripts add with `+` keys verl lacks and verl_like has; `++` adds or overrides either way.
        out.append(f"++{key}={value}" if prefix == "+" and key != "trainer" else f"{prefix}{key}={value}")


def _check_together(pairs: dict[str, str], strategies: list[str], errors: list[str]) -> None:
    """Checks between keys of the command line: Megatron keys need strategy=megatron; DAPO's reward_kwargs must
    agree with the data lengths."""
    strategy = {k.partition("=")[0]: k.partition("=")[2] for k in strategies}
    strategy.update({k: v for k, v in pairs.items() if k.endswith(".strategy")})
    for role, key in (("actor_rollout_ref.", "actor_rollout_ref.actor.strategy"), ("critic.", "critic.strategy")):
        megatron = sorted(k for k in pairs if k.startswith(role) and ".megatron." in k)
        if megatron and strategy.get(key) != "megatron":
            errors.append(
                f"{', '.join(megatron[:3])}{' ...' if len(megatron) > 3 else ''} set Megatron options but {key} is "
                f"{strategy.get(key, 'fsdp2 (the default)')}, so they would be unused; add {key}=megatron (verl's "
                f"--config-name={MEGATRON_CONFIG} does) or remove them"
            )
    max_resp = pairs.get("reward_model.reward_kwargs.max_resp_len")
    if max_resp is not None and max_resp != pairs.get("data.max_response_length", max_resp):
        errors.append(
            f"reward_model.reward_kwargs.max_resp_len={max_resp} differs from data.max_response_length="
            f"{pairs['data.max_response_length']}: the overlong penalty (reward_model.overlong_buffer) ends at "
            "data.max_response_length; remove reward_kwargs.max_resp_len"
        )


def _gen_batch_rounds(pairs: dict[str, str], out: list[str], notes: list[str], errors: list[str]) -> None:
    """DAPO's `data.gen_batch_size` (prompts per generation round) as verl_like's rounds of data.train_batch_size
    prompts: max_num_gen_batches scaled so that a step may generate as many prompts as verl's would."""
    gen, train = pairs.get("data.gen_batch_size"), pairs.get("data.train_batch_size")
    if gen is None:
        return
    try:
        gen_size, train_size = int(gen), int(train) if train is not None else None
    except ValueError:
        errors.append(f"data.gen_batch_size={gen} must be an integer number of prompts")
        return
    if train_size is None or gen_size < train_size:
        errors.append(
            f"data.gen_batch_size={gen}: each dynamic-sampling round here generates data.train_batch_size "
            f"prompts ({train or 'unset'}); set data.train_batch_size, and gen_batch_size no smaller, or remove it"
        )
        return
    rounds = int(pairs.get("algorithm.filter_groups.max_num_gen_batches", "10"))
    scaled = max(1, math.ceil(rounds * gen_size / train_size))
    out.append(f"algorithm.filter_groups.max_num_gen_batches={scaled}")
    notes.append(
        f"data.gen_batch_size={gen}: rounds here generate data.train_batch_size={train} prompts; "
        f"algorithm.filter_groups.max_num_gen_batches={rounds} read as {scaled} (the same most prompts per step)"
    )


def _per_gpu_micro(pairs: dict[str, str], out: list[str], notes: list[str], errors: list[str]) -> None:
    """verl's deprecated global micro-batch sizes, divided as verl's workers divide them: by the GPUs of the job
    (trainer.n_gpus_per_node x trainer.nnodes, which the command must then set), into the per-GPU key."""
    given = {key: value for key, value in pairs.items() if key in DEPRECATED_KEYS and value not in _NULL}
    if not given:
        return
    try:
        gpus = int(pairs["trainer.n_gpus_per_node"]) * int(pairs.get("trainer.nnodes", "1"))
    except (KeyError, ValueError):
        gpus = 0
    for key, value in given.items():
        per_gpu = DEPRECATED_KEYS[key]
        if per_gpu in pairs:  # verl refuses both too
            errors.append(f"{key}={value} is verl's deprecated global micro-batch size and {per_gpu} is set too; "
                          f"remove {key}")
            continue
        if gpus <= 0 or not value.isdigit() or int(value) < gpus:
            errors.append(
                f"{key}={value} is verl's deprecated global micro-batch size; set {per_gpu} (samples per forward "
                "on one GPU/worker) instead" + ("" if gpus <= 0 else f": {value} is fewer than the job's {gpus} GPUs")
                + ("" if gpus > 0 else ", or set trainer.n_gpus_per_node so that it can be divided as verl does")
            )
            continue
        out.append(f"{per_gpu}={int(value) // gpus}")
        notes.append(f"{key}={value}: verl's deprecated global size; read as {per_gpu}={int(value) // gpus} "
                     f"(divided by the job's {gpus} GPUs, as verl's workers do)")


def translate_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """verl's forms of `overrides` in verl_like's keys, and one note per translation (see the module doc).

    Every refusal of the command line is reported at once: one ConfigError listing each."""
    out: list[str] = []
    notes: list[str] = []
    errors: list[str] = []
    overrides, flags = _hydra_flags(overrides)
    strategies = _config_name_layer(flags, errors, notes)
    pairs: dict[str, str] = {}
    for override in overrides:
        if not override.strip():  # a shell line continuation followed by a comment passes a blank argument
            continue
        parts = _split(override)
        if parts is None:
            out.append(override)
            continue
        prefix, key, value = parts
        pairs[key] = value
        if key == "reward_model.reward_kwargs.max_resp_len":
            notes.append(f"{key}={value}: checked against data.max_response_length, then dropped")
            continue
        if key == "data.gen_batch_size":
            continue
        try:
            _translate_one(prefix, key, value, out, notes)
        except ConfigError as err:
            errors.append(str(err))
    _check_together(pairs, strategies, errors)
    if pairs.get("algorithm.filter_groups.metric") == "seq_final_reward" and \
            pairs.get("algorithm.use_kl_in_reward") in verl_keys.TRUE:
        errors.append("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true "
                      "compares rewards after the KL term, which dynamic sampling here does not; use seq_reward")
    _gen_batch_rounds(pairs, out, notes, errors)
    _per_gpu_micro(pairs, out, notes, errors)
    if len(errors) == 1:
        raise ConfigError(errors[0])
    if errors:
        raise ConfigError(f"{len(errors)} problems with the command line:\n" + "\n".join(f"- {e}" for e in errors))
    return [*strategies, *out], notes


def names_user_job(overrides: Sequence[str]) -> bool:
    """True when the overrides name data or a model of their own (not the demo's synthetic tasks or builtin tiny
    model) and pick no preset (`+trainer=...`)."""
    pairs = [(parts[1], parts[2]) for parts in map(_split, overrides) if parts is not None]
    demo = ("synthetic:", "tiny", "[synthetic:")
    own = any(key in USER_JOB_KEYS and not value.startswith(demo) for key, value in pairs)
    return own and "trainer" not in {key for key, _ in pairs}


def verl_default_layer(overrides: Sequence[str], cuda: bool) -> list[str]:
    """The overrides that put verl's defaults under a user's job: the verl preset (and bf16 on cuda) first."""
    if not names_user_job(overrides):
        return []
    keys = {parts[1] for parts in map(_split, overrides) if parts is not None}
    validate_first = ["trainer.val_before_train=true"] if "data.val_files" in keys else []  # verl's default
    return [f"+trainer={VERL_PRESET}", *(VERL_CUDA_OVERRIDES if cuda else ()), *validate_first]
