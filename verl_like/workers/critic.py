"""CriticWorker: the value model as a worker-group role (compute_values, update_critic, checkpoints).

    spec = RoleSpec(CriticWorker, kwargs={"config": critic, "model_path": path, "rollout_n": rollout.n})
    group = WorkerGroup(pool, spec, name="critic")
    group.init_model()
    values = group.compute_values(batch)                        # DataProto "values" (batch, response_len)
    metrics = group.update_critic(batch).meta_info["metrics"]   # {"critic/vf_loss": [one value per rank], ...}

compute_values / update_critic go through the "critic" mesh (its data-parallel ranks: every rank with fsdp2,
megatron's DP ranks otherwise, from the critic's RoleTopology) and split the batch evenly over them. The
dispatcher pads a batch whose size does not divide by the DP size with repeated rows, which would bias an update:
send update batches of a multiple of critic.ppo_mini_batch_size x rollout.n samples (itself a multiple of the DP
size).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from verl_like.algorithms import LossNormalizer, compute_value_loss
from verl_like.config.critic import CriticConfig
from verl_like.config.topology import RoleTopology, role_topology
from verl_like.engine.base import LossFn, TrainEngine
from verl_like.engine.factory import build_engine
from verl_like.engine.from_config import critic_engine_config
from verl_like.engine.model_outputs import response_mask_of
from verl_like.protocol import DataProto
from verl_like.single_controller import Dispatch, Worker, register
from verl_like.utils.device import peak_memory_metrics
from verl_like.workers.ppo_update import mean_metrics, metric_entries, run_ppo_update

logger = logging.getLogger(__name__)

_UPDATE_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "values", "returns")


class CriticWorker(Worker):
    """One rank of the critic group.

    config: the frozen `critic` node.
    model_path: local HF directory of the backbone (a causal-LM checkpoint gets a fresh value head, the same on
      every rank).
    rollout_n: samples per prompt (`actor_rollout_ref.rollout.n`); a mini-batch is config.ppo_mini_batch_size
      prompts x rollout_n samples.
    total_training_steps: the run's optimizer steps (needed by a cosine schedule or a warmup ratio).
    seed: seeds the value head's initialisation.
    topology: the critic's RoleTopology (`config.derived.topology.critic`), whose layout gives this rank's "critic"
      mesh; None computes it from config.strategy / config.megatron over this group's world.
    """

    def __init__(
        self,
        config: CriticConfig,
        model_path: str,
        *,
        rollout_n: int,
        total_training_steps: int | None = None,
        seed: int = 0,
        topology: RoleTopology | None = None,
    ) -> None:
        config.mini_batch_size_per_rank(1, rollout_n)  # rejects rollout_n < 1 at construction
        self.config = config
        self.rollout_n = rollout_n
        self.engine_config = critic_engine_config(
            config, model_path, total_training_steps=total_training_steps, seed=seed
        )
        self.topology = topology or role_topology(
            "critic", self.world_size, config.strategy, config.megatron, config.PREFIX
        )
        if self.topology.world_size != self.world_size:
            raise ValueError(
                f"CriticWorker: the critic topology spans {self.topology.world_size} ranks but this group has "
                f"{self.world_size}; build it over the critic's pool (critic_pool, or the trainer's when colocated)"
            )
        dp_rank, dp_size, is_collect = self.topology.mesh(self.rank)
        self.register_mesh("critic", dp_rank=dp_rank, dp_size=dp_size, is_collect=is_collect)
        self._engine: TrainEngine | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Joins the group's process group and builds the value model with its optimizer (engine/factory.py)."""
        self.init_distributed()
        self._engine = build_engine(self.engine_config, self.config.strategy, self.config.megatron)
        self._engine.offload()  # a no-op unless fsdp_config asks to offload between calls
        logger.info("critic rank %d: model built from %s", self.rank, self.engine_config.model_path)

    @contextmanager
    def _onloaded(self, op: str) -> Iterator[TrainEngine]:
        if self._engine is None:
            raise RuntimeError(f"CriticWorker.{op}: the model is not built; call init_model() on the group first")
        self._engine.onload()
        try:
            yield self._engine
        finally:
            self._engine.offload()

    @register(dispatch=Dispatch.DP_MESH, mesh="critic")
    def compute_values(self, data: DataProto) -> DataProto:
        """"values" `(batch, response_len)` of the critic at each response position (0 on padding)."""
        with self._onloaded("compute_values") as engine:
            return engine.forward(data)

    @register(dispatch=Dispatch.DP_MESH, mesh="critic")
    def update_critic(self, data: DataProto) -> DataProto:
        """PPO epochs of the clipped value loss; a rowless DataProto with meta_info["metrics"].

        The batch needs the model inputs, "values" (the critic's at rollout time) and "returns" (targets), and
        optionally "response_mask". Metrics (means over the update's optimizer steps of mini-batch-wide values):
        critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean, critic/grad_norm, critic/lr; and this rank's memory
        since its previous update, perf/critic/max_memory_allocated_gb and the like (utils/device.peak_memory_metrics).
        """
        missing = [key for key in _UPDATE_KEYS if key not in data.batch.keys()]
        if missing:
            raise KeyError(f"CriticWorker.update_critic: the batch lacks {missing}; it has {sorted(data.batch.keys())}")
        keys = list(_UPDATE_KEYS) + (["response_mask"] if "response_mask" in data.batch.keys() else [])
        rows = data.select(batch_keys=keys, non_tensor_keys=[], meta_keys=[])
        with self._onloaded("update_critic") as engine:
            history = run_ppo_update(engine, rows, self.config, self._make_loss_fn, rollout_n=self.rollout_n)
        return DataProto(meta_info={"metrics": {**mean_metrics(history, "critic"), **peak_memory_metrics("perf/critic")}})

    def _make_loss_fn(self, normalizer: LossNormalizer) -> LossFn:
        cliprange_value = self.config.cliprange_value

        def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto) -> tuple[torch.Tensor, dict]:
            tensors = micro_batch.batch
            mask = response_mask_of(tensors)
            value_loss = compute_value_loss(
                outputs["values"], tensors["values"], tensors["returns"], mask,
                normalizer=normalizer, cliprange_value=cliprange_value,
            )
            metrics = value_loss.metrics
            token_means = {"vf_clipfrac": metrics["vf_clipfrac"], "vpred_mean": metrics["vpred_mean"]}
            return value_loss.loss, metric_entries({"vf_loss": metrics["vf_loss"]}, token_means, mask)

        return loss_fn

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Writes the sharded model, optimizer, scheduler and RNG state to `directory` (shared by every rank)."""
        with self._onloaded("save_checkpoint") as engine:
            engine.save_checkpoint(Path(directory))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Restores what `save_checkpoint` wrote to `directory`."""
        with self._onloaded("load_checkpoint") as engine:
            engine.load_checkpoint(Path(directory))
