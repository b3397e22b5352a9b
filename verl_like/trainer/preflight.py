"""Checks of the machine a validated config will run on, before Ray or any model starts.

`validate(config)` checks the config against itself; `run_preflight(config)` checks it against this machine:
the rollout backend importable (vLLM, with the install command for the device when it is not), megatron-core for a
role with strategy=megatron, devices asked vs
present, logger packages installed, data file types and their data sources' scorers, the run
directory writable with room for a checkpoint (when its size is known), and the dashboard port free. Each failure
raises one PreflightError naming the key and the fix (packages without compiled bytecode that Python will not cache
only warn: every process would compile them from source); `main_ppo` and `trainer.launch.launch` call it before Ray.
A driver that joins an existing cluster skips the device checks: the devices are on the cluster's nodes.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

from verl_like.config.data import data_files
from verl_like.config.errors import ConfigError
from verl_like.config.pools import cluster_processes, cluster_summary
from verl_like.config.ppo import PPOConfig
from verl_like.config.rollout_backends import rollout_backend

logger = logging.getLogger(__name__)

# trainer.logger entry -> the module its sink imports, and the package to install.
LOGGER_MODULES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
# A checkpoint holds the weights plus two fp32 Adam moments: about 3x the model files (fp32 weights), more for bf16.
CHECKPOINT_SIZE_FACTOR = 3.0


class PreflightError(ConfigError):
    """A setting this machine cannot honour (missing devices or packages, unwritable paths, busy ports)."""


def check_rollout_backend(rollout_name: str, device: str) -> None:
    """Raises PreflightError when the rollout backend's package is missing (its registry entry names it and the
    install command for `device`: config/rollout_backends.py; validation checks the same)."""
    message = rollout_backend(rollout_name).missing_package_message(device)
    if message is not None:
        logger.error(message)
        raise PreflightError(message)


def check_training_backends(config: PPOConfig) -> None:
    """Raises PreflightError when a role that runs has strategy=megatron and megatron-core is not importable (the
    driver's environment is the workers'; engine/factory.py imports it in every worker)."""
    topology = config.derived.topology
    keys = []
    if config.actor_rollout_ref.actor.strategy == "megatron":
        keys.append("actor_rollout_ref.actor.strategy")
    if topology.critic is not None and config.critic.strategy == "megatron":
        keys.append("critic.strategy")
    if not keys:
        return
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no `megatron` package at all
        found = False
    if not found:
        raise PreflightError(
            f"{', '.join(f'{key}=megatron' for key in keys)} needs megatron-core, which {sys.executable} cannot "
            "import; install it (pip install megatron-core) or set the strategy to fsdp2"
        )


def run_preflight(
    config: PPOConfig, *, joining_cluster: bool | None = None, reward_fn: Callable[..., Any] | None = None
) -> None:
    """Raises PreflightError for the first setting this machine cannot honour.

    joining_cluster: the driver joins a running Ray cluster (None: decide from trainer.ray_address and
    $RAY_ADDRESS as init_ray does). reward_fn: a programmatic reward function (then data sources need no scorer).
    """
    from verl_like.utils.device import resolve_device

    check_rollout_backend(config.actor_rollout_ref.rollout.name, resolve_device(config.trainer.device))
    check_training_backends(config)
    if joining_cluster is None:
        joining_cluster = _joins_cluster(config.trainer.ray_address)
    if not joining_cluster:
        check_devices(config)
        check_dashboard_port(config)
    check_loggers(config.trainer.logger)
    check_data_files(config)
    check_image_data(config)
    if reward_fn is None:
        check_data_sources_have_scorers(config)
    check_run_dir(config)
    package = rollout_backend(config.actor_rollout_ref.rollout.name).package
    warn_uncompiled_packages(("torch", "transformers", "ray") + ((package,) if package else ()))


def uncompiled_packages(packages: tuple[str, ...]) -> list[Path]:
    """The directories of `packages` that every new process would compile from source again: no bytecode cached
    beside their __init__.py, and Python may not write it (PYTHONDONTWRITEBYTECODE, or a read-only directory)."""
    found = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin)
        if Path(importlib.util.cache_from_source(str(source))).exists():
            continue
        if sys.dont_write_bytecode or not os.access(source.parent, os.W_OK):
            found.append(source.parent)
    return found


def warn_uncompiled_packages(packages: tuple[str, ...]) -> None:
    """Warns (does not fail) when Python will compile these packages from source in every process: each Ray
    worker and vLLM engine then starts seconds later (uv installs without bytecode by default)."""
    missing = uncompiled_packages(packages)
    if missing:
        logger.warning(
            "no compiled bytecode for %s, and Python will not cache it here (%s): every worker and engine process "
            "compiles them from source again, several seconds each. Compile them once:\n    %s -m compileall -q "
            "-j 0 %s\n(or install with `uv pip install --compile-bytecode`, as scripts/setup.sh does)",
            ", ".join(path.name for path in missing),
            "PYTHONDONTWRITEBYTECODE is set" if sys.dont_write_bytecode else "their directories are read-only",
            sys.executable, " ".join(str(path) for path in missing),
        )


def _joins_cluster(address: str | None) -> bool:
    from verl_like.single_controller.cluster import resolve_cluster_address

    try:
        return resolve_cluster_address(address) is not None
    except ValueError as err:
        raise PreflightError(str(err)) from err


def check_devices(config: PPOConfig, cuda_devices: int | None = None) -> None:
    """The local cluster must hold the world's devices: GPUs for device=cuda, logical CPUs for every worker.

    Only for a local one-node cluster (validate refuses trainer.nnodes > 1 without one to join).

    cuda_devices: GPUs visible here (None: ask torch). Ray would otherwise wait for them until
    trainer.timeouts.worker_start_timeout_s.
    """
    from verl_like.utils.device import resolve_device

    trainer = config.trainer
    world, asked = cluster_processes(config)  # trainer workers + started servers + roles on pools of their own
    if resolve_device(trainer.device) == "cuda":  # load_config resolves auto; a config built otherwise may keep it
        if cuda_devices is None:
            import torch

            from verl_like.utils.device import is_cuda_available

            cuda_devices = torch.cuda.device_count() if is_cuda_available() else 0
        asked_gpus = trainer.ray_init.num_gpus if trainer.ray_init.num_gpus is not None else cuda_devices
        if cuda_devices == 0:
            raise PreflightError(
                "trainer.device=cuda but this machine has no usable GPU (torch.cuda sees none"
                f"{', VERL_LIKE_FORCE_CPU=1 is set' if os.environ.get('VERL_LIKE_FORCE_CPU') == '1' else ''}); "
                "set trainer.device=cpu (or auto), or run on a GPU machine / join a GPU cluster with trainer.ray_address"
            )
        if asked > min(cuda_devices, asked_gpus):
            share = ""
            if config.placement.starts_servers and asked > config.trainer.world_size:
                share = (", or set rollout_pool.gpu_fraction=0.5 (and rollout.gpu_memory_utilization <= 0.5) to run "
                         "the servers on the trainer's GPUs")
            raise PreflightError(
                f"{cluster_summary(config)} ask {asked} GPUs but the local cluster has "
                f"{min(cuda_devices, asked_gpus)} (GPUs here: {cuda_devices}, trainer.ray_init.num_gpus="
                f"{trainer.ray_init.num_gpus}); lower trainer.n_gpus_per_node or raise trainer.ray_init.num_gpus"
                f"{share}"
            )
    cpus = os.cpu_count() or 1
    needed = world * trainer.cpus_per_worker
    if trainer.ray_init.num_cpus is None and needed > cpus:  # a set num_cpus is checked by validate
        raise PreflightError(
            f"{world} processes ({cluster_summary(config)}) x trainer.cpus_per_worker={trainer.cpus_per_worker} need "
            f"{needed:g} logical CPUs but "
            f"this machine has {cpus} and trainer.ray_init.num_cpus=null counts them; lower trainer.cpus_per_worker "
            "or trainer.n_gpus_per_node, or set trainer.ray_init.num_cpus (logical CPUs may exceed the cores)"
        )


def check_loggers(loggers: tuple[str, ...]) -> None:
    """Every trainer.logger backend's package must be importable."""
    for name in loggers:
        if name not in LOGGER_MODULES:
            continue
        module, package = LOGGER_MODULES[name]
        if importlib.util.find_spec(module) is None:
            raise PreflightError(
                f"trainer.logger contains {name!r} but the {package!r} package is not installed; "
                f"`pip install {package}` or remove {name} from trainer.logger"
            )


def check_data_files(config: PPOConfig) -> None:
    """Each data file must have a readable suffix (validate checks it too; existence is checked by validate)."""
    from verl_like.config.validate import data_file_type_errors

    errors = data_file_type_errors(config)
    if errors:
        raise PreflightError(errors[0])


def check_image_data(config: PPOConfig) -> None:
    """Rows with images (data.image_key) are read and checked before Ray starts: a missing or unreadable image or
    a placeholder count unequal to the image count is refused naming the row (data/vision.py)."""
    from verl_like.data.vision import check_image_rows

    for split in ("data.train_files", "data.val_files"):
        readable = [path for key, path in data_files(config.data) if key == split and Path(path).expanduser().is_file()]
        if readable:
            check_image_rows(readable, config.data)


def _data_sources(path: Path, column: str) -> set[str] | None:
    """The distinct values of `column` in a parquet/jsonl file (None when the file has no such column)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        if column not in pq.read_schema(path).names:
            return None
        return {str(v) for v in pq.read_table(path, columns=[column]).column(column).to_pylist()}
    import json

    values: set[str] = set()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                if isinstance(record, dict) and column in record:
                    values.add(str(record[column]))
    return values


def check_data_sources_have_scorers(config: PPOConfig) -> None:
    """Without custom_reward_function, every data source of the data must have a registered rule scorer."""
    if config.custom_reward_function.path or (config.reward_model.enable and config.reward_model.combine == "replace"):
        return
    from verl_like.rewards.registry import SCORERS

    column = config.data.reward_fn_key
    for key, path in data_files(config.data):
        file = Path(path).expanduser()
        if not file.is_file():
            continue
        try:
            sources = _data_sources(file, column)
        except (OSError, ValueError) as err:  # unreadable files are reported with their row by the dataset
            logger.debug("preflight: could not read %s for its data sources: %s", file, err)
            continue
        unknown = sorted((sources or set()) - set(SCORERS))
        if unknown:
            raise PreflightError(
                f"{key}: {path!r} has rows with data_source {unknown[:5]} (column data.reward_fn_key={column!r}) "
                f"that no rule scorer handles, so every such sample would score 0; set custom_reward_function.path "
                f"and .name to your scorer, or register one with @register_scorer (registered: {sorted(SCORERS)})"
            )


def checkpoint_size_estimate(config: PPOConfig) -> int | None:
    """Bytes one checkpoint needs (about 3x the model's weight files, plus the critic's), or None when unknown."""
    from verl_like.config.derived import uses_critic

    model = config.actor_rollout_ref.model
    if model.is_builtin:
        return None  # built at run time; tiny
    paths = [Path(model.path).expanduser()]
    if uses_critic(config):
        critic = config.critic.model.path
        paths.append(Path(critic).expanduser() if critic and critic != "tiny" else paths[0])
    total = 0
    for directory in paths:
        weights = [*directory.glob("*.safetensors"), *directory.glob("*.bin")]
        if not weights:
            return None
        total += sum(f.stat().st_size for f in weights)
    return int(total * CHECKPOINT_SIZE_FACTOR)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_run_dir(config: PPOConfig) -> None:
    """trainer.default_local_dir must be a writable folder (created if missing) with room for a checkpoint."""
    trainer = config.trainer
    run_dir = Path(trainer.default_local_dir).expanduser()
    key = f"trainer.default_local_dir={trainer.default_local_dir!r}"
    existing = _nearest_existing(run_dir.absolute())
    if not existing.is_dir():
        raise PreflightError(
            f"{key} cannot be created: {existing} is a file, not a folder; point trainer.default_local_dir elsewhere"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".preflight-{uuid.uuid4().hex}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        raise PreflightError(
            f"{key} is not writable ({type(err).__name__}: {err}); point trainer.default_local_dir at a folder you "
            "can write, or fix its permissions"
        ) from err
    needed = checkpoint_size_estimate(config) if trainer.save_freq > 0 else None
    if needed is not None:
        free = shutil.disk_usage(run_dir).free
        if free < needed:
            raise PreflightError(
                f"{key} has {free / 2**30:.1f} GiB free but one checkpoint needs about {needed / 2**30:.1f} GiB "
                "(3x the model files); free space, point trainer.default_local_dir at a larger disk, or set "
                "trainer.save_freq=-1"
            )


def check_dashboard_port(config: PPOConfig) -> None:
    """With trainer.ray_init.include_dashboard, its port must be free on trainer.ray_init.dashboard_host."""
    ray_init = config.trainer.ray_init
    if not ray_init.include_dashboard:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ray_init.dashboard_host, ray_init.dashboard_port))
        except OSError as err:
            raise PreflightError(
                f"trainer.ray_init.dashboard_port={ray_init.dashboard_port} on {ray_init.dashboard_host} is not "
                f"free ({err.strerror}); stop what listens there, pick another port, or set "
                "trainer.ray_init.include_dashboard=false"
            ) from err
