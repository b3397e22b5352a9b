"""Builds what the trainer loop drives: model files, tokenizer, data loaders, reward manager, worker groups."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from verl_like.config.placement import PlacementKind
from verl_like.config.ppo import PPOConfig
from verl_like.config.rollout import uses_agent_loops
from verl_like.protocol import DataProto
from verl_like.shapes.decoder import DecoderShape
from verl_like.single_controller import ResourcePool, RoleSpec, WorkerGroup
from verl_like.single_controller.timeouts import CallTimeouts
from verl_like.single_controller.worker_group import RoleHandle
from verl_like.trainer.rollout_handle import (
    ColocatedRollout,
    LaunchedServers,
    RolloutHandle,
    ServerRolloutHandle,
    launch_servers,
)
from verl_like.utils.device import resolve_device
from verl_like.utils.progress import phase

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where built models and generated data are cached ($VERL_LIKE_CACHE_DIR, default ~/.cache/verl_like)."""
    return Path(os.environ.get("VERL_LIKE_CACHE_DIR", Path.home() / ".cache" / "verl_like")).expanduser()


def resolve_model_path(config: PPOConfig) -> str:
    """A local HF directory for the policy: the configured one, or the builtin tiny model built (once) here."""
    model = config.actor_rollout_ref.model
    if not model.is_builtin:
        return str(Path(model.path).expanduser())
    from verl_like.config.model import tiny_model_spec
    from verl_like.data.synthetic import SYNTHETIC_PREFIX, parse_synthetic_spec
    from verl_like.models.warmstart import WarmStartSpec, build_warmstart_model

    # The builtin model starts from a short supervised fine-tune on the synthetic task it will be trained on
    # (its `sft` split, disjoint from the held-out test split), as real RL starts from a supervised model.
    train = config.data.train_files
    first = train if isinstance(train, str) else train[0]
    task = parse_synthetic_spec(first)[0] if first.startswith(SYNTHETIC_PREFIX) else WarmStartSpec().task
    from verl_like.data.synthetic import get_task

    if get_task(task).tokenizer == "vlm":  # an image task: the tiny vision-language model (models/tiny_vlm.py)
        from verl_like.models.warmstart_vlm import vlm_warmstart_for

        return str(vlm_warmstart_for(model, task, cache_dir() / "models"))

    # A task names the tokenizer its model needs (tool tasks: JSON characters and the tool-call tags).
    tiny = dataclasses.replace(tiny_model_spec(model), tokenizer=get_task(task).tokenizer)
    spec = WarmStartSpec(model=tiny, task=task)
    return str(build_warmstart_model(cache_dir() / "models", spec))


def model_shape(model_path: str, trust_remote_code: bool = False) -> DecoderShape | None:
    """The FLOP-count shape of the HF model at `model_path`, or None when its config lacks a decoder's sizes."""
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        return DecoderShape.from_hf_config(hf_config, text_config=False)
    except (AttributeError, TypeError, ValueError) as err:
        logger.info("no FLOP count (hence no MFU) for %s: %s", model_path, err)
        return None


@dataclass
class TrainerComponents:
    """Handles the loop uses; `shutdown()` releases the workers, pools and scoring processes.

    reward_model: the reward-model role (reward_model.enable), else None. tokenizer: the policy's.
    world_size: the actor-rollout group's workers; actor_dp_size: the DP ranks its batches split over (world_size
      with fsdp2, world_size / (TP * PP) with megatron).
    actor_shape / critic_shape: model sizes for the MFU estimate (None: not a decoder we can count, or no critic).
    """

    actor_rollout: RoleHandle
    rollout: RolloutHandle  # ColocatedRollout or ServerRolloutHandle (trainer/rollout_handle.py)
    critic: RoleHandle | None
    reward_manager: Any
    train_loader: Any
    val_loader: Any
    needs_reference: bool
    world_size: int
    total_training_steps: int
    actor_dp_size: int | None = None  # None: world_size (components built by hand)
    reward_model: RoleHandle | None = None
    teacher: RoleHandle | None = None  # distillation.enable: the teacher's top-k log-probs (workers/teacher.py)
    tokenizer: Any = None
    actor_shape: DecoderShape | None = None
    critic_shape: DecoderShape | None = None
    groups: list[WorkerGroup] = field(default_factory=list)
    pools: list[ResourcePool] = field(default_factory=list)
    startup: dict[str, float] = field(default_factory=dict)  # "startup/*" seconds, logged with the first step

    def val_batches(self) -> Iterator[DataProto]:
        """One pass over the validation set (nothing when data.val_files is empty)."""
        if self.val_loader is None:
            return iter(())
        self.val_loader.epoch, self.val_loader.position = 0, 0
        return iter(self.val_loader)

    def shutdown(self) -> None:
        self.rollout.close()  # engines or servers first (on CPU, TP engines hold shared-memory segments)
        for group in self.groups:
            group.shutdown()
        for pool in self.pools:
            pool.remove()
        self.reward_manager.close()


def slowest_rank(per_rank: Any) -> dict[str, float]:
    """Each "startup/*" time of an init_model call's per-rank answers at its slowest rank (a user's worker may
    answer None: nothing)."""
    merged: dict[str, float] = {}
    for answer in per_rank if isinstance(per_rank, list) else [per_rank]:
        for key, value in (answer or {}).items():
            merged[key] = max(merged.get(key, 0.0), float(value))
    return merged


def _policy_hf_config(config: PPOConfig, model_path: str) -> Any:
    """The policy's HF config with actor_rollout_ref.model.override_config applied (what the servers build)."""
    from verl_like.engine.model_loading import load_hf_config

    model = config.actor_rollout_ref.model
    return load_hf_config(model_path, trust_remote_code=model.trust_remote_code,
                          override_config=dict(model.override_config) if model.override_config else None)


def _server_kv_cache(config: PPOConfig, model_path: str, hf_config: Any) -> Any:
    """The KV cache the servers are asked for (rollout/kv_cache.py's KVCacheRequest; None: vLLM sizes it)."""
    from verl_like.rollout.kv_cache import kv_cache_request

    return kv_cache_request(config.actor_rollout_ref.rollout, hf_config, model_path,
                            resolve_device(config.trainer.device))


def servers_size_kv_cache(config: PPOConfig, model_path: str) -> bool:
    """Whether the servers start with their KV cache's size given (rollout.kv_cache_tokens a number, or null on
    CUDA for a plain-attention model), so that they need not wait for the trainer's models on shared devices."""
    return _server_kv_cache(config, model_path, _policy_hf_config(config, model_path)) is not None


def _launch_servers(config: PPOConfig, model_path: str, trainer_pool: ResourcePool | None) -> LaunchedServers:
    """Starts the servers (or names the user's) with the flags the rollout backend's ServerBackend makes of the
    config (rollout/server_backend.py); does not wait for them."""
    from verl_like.engine.model_loading import resolved_overrides
    from verl_like.rollout.backends import server_backend

    rollout, model, trainer = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, config.trainer
    hf_config = _policy_hf_config(config, model_path)
    overrides = resolved_overrides(hf_config, dict(model.override_config)) if model.override_config else {}
    device = resolve_device(trainer.device)
    backend = server_backend(rollout.name)
    adapter_rank = adapter_window = 0
    if serves_adapters(config):
        from verl_like.rollout.server_lora import window_size

        adapter_rank, adapter_window = model.lora_rank, window_size(config.async_training.staleness)
    args = backend.engine_args(rollout, hf_overrides=overrides, trust_remote_code=model.trust_remote_code,
                               weight_transfer=config.placement.weight_transfer(device), adapter_rank=adapter_rank,
                               adapter_window=adapter_window,
                               kv_cache=_server_kv_cache(config, model_path, hf_config))
    return launch_servers(
        config, model_path, args, device, trainer.cpus_per_worker, trainer.timeouts.worker_start_timeout_s,
        log_dir=str(Path(trainer.default_local_dir) / "server_logs"), trainer_pool=trainer_pool,
    )


def serves_adapters(config: PPOConfig) -> bool:
    """Server mode with LoRA adapter-only sync: the servers serve adapters (rollout/server_lora.py)."""
    model = config.actor_rollout_ref.model
    return config.placement.uses_servers and model.lora_enabled and not model.lora.merge


def _server_rollout(config: PPOConfig, model_path: str, actor_rollout: RoleHandle, tokenizer: Any,
                    pending: Any, trainer_pool: ResourcePool, startup: dict[str, float],
                    launched: LaunchedServers | None = None) -> ServerRolloutHandle:
    """Waits for the vLLM servers (`launched`, or starts them now), links the actor group to them and sends the
    weights once; notes "startup/servers_s" (launch to healthy) and "startup/first_sync_s" in `startup`, with
    the workers' own times.

    Servers on the trainer's devices (rollout_pool.gpu_fraction > 0) start after the trainer's models are built
    when vLLM sizes their KV cache (it measures the memory it sees change while it profiles, which a trainer
    loading at the same moment would distort); given its size (`servers_size_kv_cache`), and on devices of their
    own, they were launched before the trainer's workers."""
    from verl_like.rollout.servers import ServerGenerator
    from verl_like.trainer.server_supervision import ServerSupervision

    rollout = config.actor_rollout_ref.rollout
    if launched is None:
        if config.placement.shares_trainer_devices:
            pending.result()
        launched = _launch_servers(config, model_path, trainer_pool)
    clients, supervisors, pool = launched.wait_ready()
    # A user's servers: were they launched with LoRA and its window?
    if serves_adapters(config) and config.placement.kind is PlacementKind.USER_SERVERS:
        from verl_like.resharding.transports.server_adapter import check_lora_servers
        from verl_like.rollout.server_lora import window_size

        check_lora_servers(clients, config.actor_rollout_ref.model.lora_rank,
                           window_size(config.async_training.staleness))
    startup["startup/servers_s"] = time.monotonic() - launched.started
    servers = ServerGenerator(clients, tokenizer.pad_token_id, rollout.server.max_concurrent_requests,
                            request_timeout_s=rollout.server.request_timeout_s,
                            request_retries=rollout.server.request_retries,
                            retry_backoff_s=rollout.server.retry_backoff_s)
    # Partial rollout freezes in-flight requests across an update instead of waiting for them.
    pause_mode = "keep" if config.async_training.partial_rollout else rollout.server.pause_mode
    weight_transfer = config.placement.weight_transfer(resolve_device(config.trainer.device))
    addresses = [client.address for client in clients]

    def link() -> list[dict[str, float]]:
        return actor_rollout.connect_rollout_servers(addresses, pause_mode, weight_transfer)

    supervision = None
    if supervisors:
        supervision = ServerSupervision(supervisors, servers.servers, link, rollout.server.max_restarts,
                                        rollout.server.start_timeout_s)
        servers.servers.on_unresponsive = supervision.stop_unresponsive
    handle = ServerRolloutHandle(rollout, actor_rollout, servers, supervisors, pool, supervision,
                               serves_adapters=serves_adapters(config))
    try:
        startup.update(slowest_rank(pending.result()))
        started = time.perf_counter()
        link()
        startup["startup/first_sync_s"] = time.perf_counter() - started
    except BaseException:
        handle.close()
        raise
    return handle


def _start_agent_loops(config: PPOConfig, rollout: Any, actor_rollout: RoleHandle, tokenizer: Any) -> None:
    """Rollouts through agent loops (docs/agents.md): in each colocated worker on its engine, or on the driver
    against the servers."""
    from verl_like.experimental.agent_loop.runner import AgentLoopRunner, agent_config_dict, registry_snapshot

    plain = agent_config_dict(config)
    if isinstance(rollout, ServerRolloutHandle):
        from omegaconf import OmegaConf

        rollout.start_agent_loops(AgentLoopRunner(OmegaConf.create(plain), tokenizer))
    else:
        actor_rollout.configure_agent_loops(plain, registry_snapshot())


@dataclass
class DataParts:
    """What the loop reads before any worker starts: the policy's tokenizer, the prompt loaders, the step count and
    the reward manager (its scoring processes, when reward_model.scoring_workers > 0)."""

    tokenizer: Any
    train_loader: Any
    val_loader: Any
    total_steps: int
    reward_manager: Any


def build_data(config: PPOConfig, model_path: str, reward_fn: Callable[..., Any] | None = None) -> DataParts:
    """Tokenizer, the checks that need it (chat template for agent loops, the reward model's tokenizer), datasets
    and loaders, and the reward manager: everything that fails on the user's files before a Ray actor starts."""
    from transformers import AutoTokenizer

    from verl_like.config.tokenizer_check import check_same_tokenizer
    from verl_like.data.dataset import RLDataset
    from verl_like.data.loader import PromptLoader
    from verl_like.data.synthetic import resolve_data_files
    from verl_like.data.vision import check_vision_config, load_processor
    from verl_like.rewards.custom import load_custom_function
    from verl_like.rewards.manager import RewardManager

    model = config.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(
        model.tokenizer_path or model_path, trust_remote_code=model.trust_remote_code
    )
    if uses_agent_loops(config.actor_rollout_ref.rollout):  # a template that rewrites history corrupts trajectories
        from verl_like.experimental.agent_loop.engine_rollout import check_chat_template
        from verl_like.experimental.agent_loop.runner import agent_config_view

        check_chat_template(tokenizer, agent_config_view(config))
    if config.derived.use_reward_model:
        rm_model = config.reward_model.model
        check_same_tokenizer(tokenizer, rm_model.path, trust_remote_code=rm_model.trust_remote_code)
    data_dir = cache_dir() / "data"
    processor = load_processor(model.tokenizer_path or model_path, model.trust_remote_code)  # None: text model
    train_set = RLDataset(resolve_data_files(config.data.train_files, data_dir), tokenizer, config.data, processor,
                          model_path)
    val_files = config.data.val_files
    val_set = (RLDataset(resolve_data_files(val_files, data_dir), tokenizer, config.data, processor, model_path)
               if val_files else None)
    check_vision_config(config, train_set, val_set)
    train_loader = PromptLoader(train_set, config.data.train_batch_size, shuffle=config.data.shuffle, seed=config.data.seed)
    val_loader = None
    if val_set is not None:
        val_loader = PromptLoader(val_set, config.data.val_batch_size or len(val_set), shuffle=False, drop_last=False)
    total_steps = config.trainer.total_training_steps or len(train_loader) * config.trainer.total_epochs

    custom = config.custom_reward_function
    if reward_fn is None and custom.path:
        reward_fn = load_custom_function(custom.path, custom.name)
    reward_manager = RewardManager(
        tokenizer,
        reward_fn,
        num_workers=config.reward_model.scoring_workers,
        timeout_s=config.reward_model.scoring_timeout_s,
        reward_fn_key=config.data.reward_fn_key,
        error_policy=config.reward_model.error_policy,
        max_error_fraction=config.reward_model.max_error_fraction,
    )
    return DataParts(tokenizer, train_loader, val_loader, total_steps, reward_manager)


def role_specs(
    config: PPOConfig,
    model_path: str,
    data: DataParts,
    actor_rollout_worker: type | None = None,
    actor_rollout_kwargs: dict[str, Any] | None = None,
    critic_worker: type | None = None,
    reward_model_worker: type | None = None,
) -> tuple[dict[str, RoleSpec], dict[str, tuple[RoleSpec, Any]]]:
    """The roles of the trainer's one process per rank (actor+rollout+reference, and the critic, reward model and
    teacher where colocated), and the roles on pools of their own (name -> (spec, its pool's config))."""
    from verl_like.workers.actor_rollout import ActorRolloutWorker
    from verl_like.workers.critic import CriticWorker
    from verl_like.workers.custom_worker import accepts_keyword, adapt_worker_class
    from verl_like.workers.reward_model import RewardModelWorker

    derived = config.derived
    topology = derived.topology  # decided once here; each role registers its meshes from its part
    actor_rollout_cls = adapt_worker_class(actor_rollout_worker) if actor_rollout_worker else ActorRolloutWorker
    # A user's worker with a constructor of its own that lists the framework's arguments may predate `topology`;
    # it then computes the same layouts itself (config/topology.actor_group_topology).
    actor_rollout_topology = {"topology": topology} if accepts_keyword(actor_rollout_cls, "topology") else {}
    roles = {
        "actor_rollout": RoleSpec(
            actor_rollout_cls,  # issue 16
            kwargs={
                "model_path": model_path,
                "actor": config.actor_rollout_ref.actor,
                "rollout": config.actor_rollout_ref.rollout,
                "ref": config.actor_rollout_ref.ref if derived.use_reference_policy else None,
                "total_training_steps": data.total_steps,
                "seed": config.data.seed,
                "model": config.actor_rollout_ref.model,
                **actor_rollout_topology,
                **(actor_rollout_kwargs or {}),
            },
        )
    }
    if derived.use_critic:
        critic_cls = critic_worker or CriticWorker
        roles["critic"] = RoleSpec(
            critic_cls,
            kwargs={
                "config": config.critic,
                "model_path": config.critic.model.path or model_path,
                "rollout_n": config.actor_rollout_ref.rollout.n,
                "total_training_steps": data.total_steps,
                **({"topology": topology.critic} if accepts_keyword(critic_cls, "topology") else {}),
            },
        )
    if derived.use_reward_model:
        roles["reward_model"] = RoleSpec(
            reward_model_worker or RewardModelWorker,
            kwargs={"config": config.reward_model, "seed": config.data.seed},
        )
    own: dict[str, tuple[RoleSpec, Any]] = {}
    for name, pool_config in (("critic", config.critic_pool), ("reward_model", config.reward_model_pool)):
        if name in roles and not pool_config.colocated:
            own[name] = (roles.pop(name), pool_config)
    if config.distillation.enable:
        from verl_like.trainer.distillation_setup import teacher_role

        roles["teacher"] = teacher_role(config, data.tokenizer, cache_dir() / "models")
    return roles, own


def _start_rollout(config: PPOConfig, model_path: str, actor_rollout: RoleHandle, tokenizer: Any, pending: Any,
                   pool: ResourcePool, startup: dict[str, float], launched: LaunchedServers | None) -> RolloutHandle:
    """The rollout side once the trainer's workers run: the servers (started here, or `launched` early) linked and
    synced, or the colocated engines built; then the agent loops where configured. Owns `launched` from here (a
    failure releases it)."""
    if config.placement.uses_servers:
        with phase("building the trainer's models, starting the vLLM servers, first sync", log=logger):
            rollout = _server_rollout(config, model_path, actor_rollout, tokenizer, pending, pool, startup, launched)
    else:
        with phase("building the trainer's models and rollout engines", log=logger):
            startup.update(slowest_rank(pending.result()))
        rollout = ColocatedRollout(actor_rollout)
    if uses_agent_loops(config.actor_rollout_ref.rollout):
        try:
            _start_agent_loops(config, rollout, actor_rollout, tokenizer)
        except BaseException:
            rollout.close()
            raise
    return rollout


def build_components(
    config: PPOConfig,
    actor_rollout_worker: type | None = None,
    actor_rollout_kwargs: dict[str, Any] | None = None,
    critic_worker: type | None = None,
    reward_fn: Callable[..., Any] | None = None,
    reward_model_worker: type | None = None,
) -> TrainerComponents:
    """Everything `PPOTrainer` needs, in the order that fails fastest: files and data first (`build_data`), then
    the roles (`role_specs`), their pools and worker processes, then the rollout side (`_start_rollout`).

    The *_worker classes replace the default role classes (subclasses of ActorRolloutWorker, CriticWorker,
    RewardModelWorker); the reward-model role runs only with reward_model.enable.
    """
    derived = config.derived
    model_path = resolve_model_path(config)
    model = config.actor_rollout_ref.model
    data = build_data(config, model_path, reward_fn)
    tokenizer, reward_manager = data.tokenizer, data.reward_manager

    trainer = config.trainer
    started = time.perf_counter()
    try:
        roles, own = role_specs(config, model_path, data, actor_rollout_worker, actor_rollout_kwargs, critic_worker,
                                reward_model_worker)
    except BaseException:
        reward_manager.close()
        raise
    pool = ResourcePool.create(
        [trainer.n_gpus_per_node] * trainer.nnodes,
        device=resolve_device(trainer.device),
        cpus_per_process=trainer.cpus_per_worker,
        name="global_pool",
        ready_timeout_s=trainer.timeouts.worker_start_timeout_s,
    )
    pool_ready = time.perf_counter()
    launched = None
    try:
        # Every other role of a rank lives in one process (the hybrid engine): they share the device and its memory.
        placement = config.placement
        on_cuda = resolve_device(trainer.device) == "cuda"
        if placement.shares_trainer_devices and config.async_training.enable and on_cuda:
            logger.warning(
                "async_training with the servers on the trainer's GPUs (rollout_pool.gpu_fraction=%s): the server "
                "and the trainer are two processes, whose kernels take turns on a GPU rather than overlap (no "
                "MPS); on one H100 staleness 1 measured no faster than the synchronous step (docs/benchmarks.md). "
                "It is meant for servers on GPUs of their own (rollout_pool)", placement.gpu_fraction)
        if placement.servers_start_early:
            launched = _launch_servers(config, model_path, None)
        elif placement.shares_trainer_devices and servers_size_kv_cache(config, model_path):
            # vLLM given its KV cache's size does not measure the memory the trainer's models are taking.
            launched = _launch_servers(config, model_path, pool)
        with phase(f"starting {derived.world_size} trainer worker process(es)", log=logger):
            group = WorkerGroup(
                pool,
                roles,
                name="hybrid",
                default_timeout_s=CallTimeouts.from_config(trainer.timeouts),
                init_timeout_s=trainer.timeouts.worker_start_timeout_s,
                resource_fraction=placement.trainer_fraction,  # < 1 when servers share these devices
            )
    except BaseException:  # nothing started so far outlives a failed start
        if launched is not None:
            launched.abort()
        pool.remove()
        reward_manager.close()
        raise
    groups, pools = [group], [pool]
    # worker_processes = resource_pool (placement groups ready) + process_start (rank 0's process answers: Ray's
    # worker start, the host's imports) + role_construction (the roles' imports, process groups, __init__)
    startup = {
        "startup/worker_processes_s": time.perf_counter() - started,
        "startup/resource_pool_s": pool_ready - started,
        **{f"startup/{name}": seconds for name, seconds in group.startup_times.items()},
    }
    actor_rollout = group.role("actor_rollout")
    pending = actor_rollout.init_model(blocking=False)  # the trainer's models build while servers start
    rollout = None
    try:
        handles = {name: group.role(name) for name in ("critic", "reward_model") if name in roles}
        for name, (spec, pool_config) in own.items():
            role_pool = ResourcePool.create(
                [pool_config.n_gpus_per_node] * pool_config.nnodes, device=resolve_device(trainer.device),
                cpus_per_process=trainer.cpus_per_worker, name=f"{name}_pool",
                ready_timeout_s=trainer.timeouts.worker_start_timeout_s,
            )
            pools.append(role_pool)
            groups.append(WorkerGroup(
                role_pool, {name: spec}, name=name, default_timeout_s=trainer.timeouts.worker_call_timeout_s,
                init_timeout_s=trainer.timeouts.worker_start_timeout_s,
            ))
            handles[name] = groups[-1].role(name)
        critic, reward_model = handles.get("critic"), handles.get("reward_model")
        teacher = group.role("teacher") if config.distillation.enable else None
        early, launched = launched, None  # from here _start_rollout owns the servers launched early
        rollout = _start_rollout(config, model_path, actor_rollout, tokenizer, pending, pool, startup, early)
        for role in (critic, reward_model, teacher):
            if role is not None:
                role.init_model()
        token_budgets = size_token_budgets(config, actor_rollout)  # every model of the devices is in place now
    except BaseException:
        if rollout is not None:
            rollout.close()
        if launched is not None:
            launched.abort()
        for each in groups:
            each.shutdown()
        for each in pools:
            each.remove()
        reward_manager.close()
        raise
    critic_path = config.critic.model.path or model_path
    return TrainerComponents(
        actor_rollout=actor_rollout,
        rollout=rollout,
        critic=critic,
        reward_manager=reward_manager,
        train_loader=data.train_loader,
        val_loader=data.val_loader,
        needs_reference=derived.use_reference_policy,
        world_size=derived.world_size,
        actor_dp_size=derived.actor_dp_size,
        total_training_steps=data.total_steps,
        reward_model=reward_model,
        teacher=teacher,
        tokenizer=tokenizer,
        actor_shape=model_shape(model_path, model.trust_remote_code),
        critic_shape=model_shape(critic_path, config.critic.model.trust_remote_code) if derived.use_critic else None,
        groups=groups,
        pools=pools,
        startup={**startup, **token_budgets, "startup/total_s": time.perf_counter() - started},
    )


def size_token_budgets(config: PPOConfig, actor_rollout: RoleHandle) -> dict[str, float]:
    """The token budget of every token-batched pass under its metric name (actor/token_budget, ...), logged with
    the first step: null keys sized from the devices' free memory once the models are built (config/token_budget.py
    says when they are not: then, like a key set to a number, the configured value or 16,384)."""
    from verl_like.config.actor import configured_token_budget
    from verl_like.config.token_budget import (
        BUDGET_METRICS, auto_budget_blocker, auto_budget_passes, longest_sequence, token_batched_passes,
    )

    budgets = {name: configured_token_budget(value) for name, value in token_batched_passes(config).items()}
    passes = auto_budget_passes(config)
    blocker = auto_budget_blocker(config) if passes else None
    if passes and blocker is None:
        with phase("sizing the token budgets from free device memory", log=logger):
            per_rank = actor_rollout.size_token_budgets(list(passes), longest_sequence(config),
                                                        config.trainer.timeouts.worker_start_timeout_s)
        budgets.update(per_rank[0] if isinstance(per_rank, list) else per_rank)  # the same on every rank
    if budgets:
        how = ("null ones sized from free device memory" if passes and blocker is None
               else f"null ones not sized ({blocker})" if passes else "as configured")
        logger.info("token budgets per micro-batch (%s): %s", how, budgets)
    return {BUDGET_METRICS[name]: float(value) for name, value in budgets.items()}
