"""TrainerConfig: the `trainer` node (run length, placement, logging, checkpoints, Ray)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_like.config.errors import ConfigError
from verl_like.config.names import LOGGER_BACKENDS

DEVICES = ("auto", "cuda", "cpu")
RESUME_MODES = ("disable", "auto", "resume_path")


@dataclass(frozen=True)
class RayInitConfig:
    """`trainer.ray_init`: arguments of the local Ray cluster the driver starts (ignored when joining one).

    num_cpus / num_gpus: logical resources of the local cluster; null lets Ray count the machine's.
    object_store_memory_mb: size of Ray's shared-memory object store; null lets Ray choose (30% of RAM).
    include_dashboard: start Ray's web dashboard.
    dashboard_host: the interface the dashboard listens on; 127.0.0.1 keeps it (and the job API) off the network.
    dashboard_port: its port; checked to be free before Ray starts (docs/reliability.md lists every port).
    """

    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_memory_mb: int | None = 512
    include_dashboard: bool = False
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8265

    def __post_init__(self) -> None:
        if not self.dashboard_host:
            raise ConfigError("trainer.ray_init.dashboard_host is empty; use 127.0.0.1 (loopback) or an interface's IP")
        if not 1 <= self.dashboard_port <= 65535:
            raise ConfigError(f"trainer.ray_init.dashboard_port={self.dashboard_port} must be a port in 1..65535")
        for key in ("num_cpus", "num_gpus", "object_store_memory_mb"):
            value = getattr(self, key)
            if value is not None and value < (1 if key != "num_gpus" else 0):
                raise ConfigError(f"trainer.ray_init.{key}={value} is out of range; use a positive number or null")


@dataclass(frozen=True)
class TimeoutsConfig:
    """`trainer.timeouts` (seconds): a worker that exceeds one fails the run with an error naming its rank and method.

    worker_start_timeout_s: waiting for the cluster to place the worker groups (and for them to build).
    worker_call_timeout_s: one worker-group call; null (default) adapts each method's timeout to its own earlier
      calls (verl_like/single_controller/timeouts.py): first_call_timeout_s for its first call, then
      max(min_call_timeout_s, call_timeout_factor x its slowest earlier call). A number fixes it for every call.
    The weight-sync timeout is actor_rollout_ref.rollout.weight_sync_timeout_s.
    """

    worker_start_timeout_s: float = 300.0
    worker_call_timeout_s: float | None = None
    first_call_timeout_s: float = 900.0
    call_timeout_factor: float = 10.0
    min_call_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for key in ("worker_start_timeout_s", "first_call_timeout_s", "call_timeout_factor", "min_call_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"trainer.timeouts.{key}={getattr(self, key)} must be > 0")
        if self.worker_call_timeout_s is not None and not self.worker_call_timeout_s > 0:
            raise ConfigError(
                f"trainer.timeouts.worker_call_timeout_s={self.worker_call_timeout_s} must be > 0, or null (adaptive)"
            )


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class TrainerConfig:
    """The run (`trainer`).

    Naming and logging
      project_name / experiment_name: names of the run in the trackers and its checkpoint folder.
      logger: metric sinks, any of console, jsonl, tensorboard, wandb, mlflow.
      log_val_generations: the first N validation samples (prompt, response, score; the same prompts every
        time) logged per validation: to the console, <default_local_dir>/val_generations.jsonl and TensorBoard
        text, as the logger list includes them.
      log_level: the level of vLLM's and Ray's logs in the workers: WARNING (default) hides their per-step
        INFO lines and known-harmless per-step warnings (verl_like/utils/quiet_logs.py); INFO or DEBUG shows all.
    Placement
      nnodes / n_gpus_per_node: the actor-rollout-ref worker group spans nnodes * n_gpus_per_node processes,
        one per GPU (device cuda) or per worker (device cpu).
      device: "cuda", "cpu" or "auto" (cuda when available; decided in verl_like/utils/device.py).
      cpus_per_worker: logical CPUs each worker reserves in Ray.
      ray_address: join this Ray cluster ("auto": the running one on this node; "host:port": its GCS address);
        "local" always starts a new local cluster; null joins $RAY_ADDRESS (set inside `ray job submit`) or a
        cluster `ray start` left on this node, else starts a local one. ray_init: RayInitConfig.
        timeouts: TimeoutsConfig.
    Length
      total_epochs: passes over the training prompts. total_training_steps: stop after this many steps (null:
        total_epochs * steps per epoch).
      critic_warmup: steps that train only the critic before the actor starts updating.
      balance_batch: reorder each batch (after rollout and reward, before the log-prob, value and update
        passes) so every DP rank gets the same number of samples and about as many tokens.
    Performance metrics
      peak_tflops_per_device: the dense peak (TFLOP/s) that perf/mfu/actor and perf/mfu/critic divide by;
        null uses 790 (a measured bf16 matmul peak of an H200) on cuda and reports no MFU on cpu.
    Validation and checkpoints
      test_freq: validate every N steps (-1: never). val_before_train: validate once before the first step.
      save_freq: checkpoint every N steps (-1: never). default_local_dir: where the run writes checkpoints
        and logs. rollout_data_dir: a folder where each training step s writes s.jsonl, one record per trained
        sample (step, index, uid, input, output, score, weight_version, ground_truth; trainer/rollout_dump.py);
        null (default): none written. max_actor_ckpt_to_keep / max_critic_ckpt_to_keep: keep the newest N
        (null: all).
      resume_mode: "disable" (fresh start), "auto" (continue from the newest checkpoint in default_local_dir if
        any), "resume_path" (continue from resume_from_path, a global_step_N folder).
      max_restarts: when a trainer worker dies (kill -9, OOM, a lost node), tear the worker groups down, start
        them again and resume from the newest checkpoint in default_local_dir, in the same process, up to this
        many times per run (trainer/restarts.py); a death at the same step as the previous one ends the run with
        both errors. 0 (default): the first death ends the run.
    """

    project_name: str = "verl_like"
    experiment_name: str = "default"
    logger: tuple[str, ...] = ("console", "jsonl", "tensorboard")
    log_val_generations: int = 0
    log_level: str = "WARNING"
    nnodes: int = 1
    n_gpus_per_node: int = 1
    device: str = "auto"
    cpus_per_worker: float = 1.0
    ray_address: str | None = None
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    total_epochs: int = 1
    total_training_steps: int | None = None
    critic_warmup: int = 0
    balance_batch: bool = True
    peak_tflops_per_device: float | None = None
    test_freq: int = -1
    val_before_train: bool = True
    save_freq: int = -1
    default_local_dir: str = "checkpoints/verl_like/default"
    rollout_data_dir: str | None = None
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    max_restarts: int = 0

    def __post_init__(self) -> None:
        p = "trainer"
        if self.max_restarts < 0:
            raise ConfigError(f"{p}.max_restarts={self.max_restarts} must be >= 0 (0: a dead worker ends the run)")
        for name in self.logger:
            if name not in LOGGER_BACKENDS:
                raise ConfigError(f"{p}.logger contains {name!r}; valid loggers: {', '.join(LOGGER_BACKENDS)}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"{p}.log_level={self.log_level!r} must be one of {LOG_LEVELS}")
        if self.device not in DEVICES:
            raise ConfigError(f"{p}.device={self.device!r} must be one of {DEVICES}")
        if self.resume_mode not in RESUME_MODES:
            raise ConfigError(f"{p}.resume_mode={self.resume_mode!r} must be one of {RESUME_MODES}")
        for key in ("nnodes", "n_gpus_per_node", "total_epochs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{p}.{key}={getattr(self, key)} must be >= 1")
        for key in ("critic_warmup", "log_val_generations"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{p}.{key}={getattr(self, key)} must be >= 0")
        for key in ("total_training_steps", "max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{p}.{key}={value} must be >= 1, or null")
        for key in ("save_freq", "test_freq"):
            value = getattr(self, key)
            if value == 0 or value < -1:
                raise ConfigError(f"{p}.{key}={value} must be >= 1 (every N steps) or -1 (never)")
        if self.peak_tflops_per_device is not None and not self.peak_tflops_per_device > 0:
            raise ConfigError(
                f"{p}.peak_tflops_per_device={self.peak_tflops_per_device} must be > 0 (TFLOP/s per device), or null"
            )
        if not self.cpus_per_worker > 0:
            raise ConfigError(f"{p}.cpus_per_worker={self.cpus_per_worker} must be > 0")
        if not self.default_local_dir:
            raise ConfigError(f"{p}.default_local_dir is empty; set the folder for checkpoints and logs")
        dump_dir = self.rollout_data_dir
        if dump_dir is not None and (not isinstance(dump_dir, str) or not dump_dir):
            raise ConfigError(
                f"{p}.rollout_data_dir={dump_dir!r} must be a folder path, or null to write no rollout dumps"
            )
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError(
                f"{p}.resume_mode='resume_path' needs {p}.resume_from_path (a global_step_N checkpoint folder)"
            )
        if self.resume_from_path and self.resume_mode != "resume_path":
            raise ConfigError(
                f"{p}.resume_from_path is set but {p}.resume_mode={self.resume_mode!r} ignores it; "
                f"set {p}.resume_mode=resume_path or unset resume_from_path"
            )

    @property
    def world_size(self) -> int:
        """Processes of the actor-rollout-ref group: nnodes * n_gpus_per_node."""
        return self.nnodes * self.n_gpus_per_node
