"""ActorRolloutWorker: the policy role (training engine, optional reference, the policy version and the weight sync)
plus its rollout side: a colocated-rollout component holding this process's rollout engine, or the link to servers
(workers/colocated_rollout.py, chosen once in `init_model` from the Topology; the worker's calls never ask which).

    spec = RoleSpec(ActorRolloutWorker, (model_path, actor_cfg, rollout_cfg, ref_cfg))
    group = WorkerGroup(pool, spec, name="actor_rollout")
    group.init_model()
    batch = group.generate_sequences(prompts)           # responses, rollout_log_probs
    batch = batch.union(group.compute_log_prob(batch))  # old_log_probs (+ rollout/logprob_diff_* metrics)
    metrics = group.update_actor(batch).meta_info["metrics"]
    group.sync_weights()                                # weight_sync/* metrics; required before the next rollout
    group.close()                                       # before group.shutdown(): releases the engine cleanly

Meshes, registered from the group's Topology (config/topology.py; the driver computes it once and hands it in):
"actor" and "ref" = the engines' data-parallel ranks (every rank with fsdp2; megatron's DP ranks, collected from TP
rank 0 of the last pipeline stage); "rollout" = TP groups of `tensor_model_parallel_size` consecutive ranks, each
group one DP rank that receives one chunk, and its TP rank 0 returns it.

Weights reach the rollout through one `WeightTransport`, chosen once by `resharding/transports/factory.py:
build_transport`: sliced for an engine that loads TP slices, full tensors otherwise (or into the user's
`update_rollout_weights`). With the rollout in servers (the driver's topology has no rollout layout then) the worker
holds no engine: `connect_rollout_servers(addresses)` builds the server transport (rank 0 sends) and the driver
generates.

Custom engines, two ways (examples/custom_rollout_worker.py):
- override `build_rollout_engine()` to return your own RolloutEngine (its `load_weights` gets full tensors);
- override the text hook `generate(prompts: list[str]) -> list[str]` around an engine you build yourself after
  `super().__init__(...)`. The framework decodes the prompts, tokenizes your texts into the response tensors;
  `compute_log_prob` then returns `rollout_log_probs` = `old_log_probs` (one actor forward for both). Override
  `update_rollout_weights(named_tensors)` too, or your engine never sees a new weight (a loud warning at start
  says so).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import AutoTokenizer

from verl_like.config.actor import ActorConfig
from verl_like.config.model import ModelConfig, RefConfig
from verl_like.config.rollout import RolloutConfig
from verl_like.config.rollout_backends import rollout_backend
from verl_like.config.topology import Topology, actor_group_topology
from verl_like.engine.base import TrainEngine
from verl_like.engine.factory import build_engine
from verl_like.engine.from_config import (
    actor_engine_config,
    log_prob_micro_batching,
    lora_settings,
    reference_engine_config,
)
from verl_like.engine.model_loading import load_hf_config
from verl_like.engine.model_outputs import response_mask_of
from verl_like.protocol import DataProto
from verl_like.resharding.transports import WeightTransport
from verl_like.resharding.transports.factory import ServerLink, build_transport, server_transport_options
from verl_like.rollout.base import RolloutEngine
from verl_like.rollout.backends import EngineBuild, build_rollout_engine
from verl_like.single_controller import Dispatch, Worker, register
from verl_like.utils.device import peak_memory_metrics
from verl_like.workers.actor import PPOActor, gap_metrics, rollout_gaps
from verl_like.workers.colocated_rollout import ColocatedRolloutComponent, ServerRolloutLink
from verl_like.workers.ppo_update import metric_entries, reduce_metrics
from verl_like.workers.reference import ReferencePolicy
from verl_like.workers.train_request import TrainRequest
from verl_like.workers.weight_version import WeightVersion

logger = logging.getLogger(__name__)


def stale_policy_warning(cls: type) -> str | None:
    """The warning for a subclass that generates with its own engine but never takes new weights, else None."""
    if cls.generate is ActorRolloutWorker.generate or cls.update_rollout_weights is not (
        ActorRolloutWorker.update_rollout_weights
    ):
        return None
    return (
        f"!!! {cls.__name__} overrides generate() but not update_rollout_weights(): its engine keeps the initial "
        "weights, so every rollout comes from a STALE POLICY while the actor trains. Override "
        "update_rollout_weights(named_tensors) to load the new weights into your engine. !!!"
    )


class ActorRolloutWorker(Worker):
    """One rank of the actor-rollout(-ref) group (see the module doc).

    model_path: local HF directory of the policy (weights, config, tokenizer).
    actor / rollout / ref: the frozen `actor_rollout_ref.{actor,rollout,ref}` nodes; ref None builds no
      reference (compute_ref_log_prob then raises).
    total_training_steps: optimizer steps of the run (cosine schedule, warmup ratio). seed: engine seed.
    model: the `actor_rollout_ref.model` node: its override_config and trust_remote_code reach the training engine,
      the reference, the rollout engine and the tokenizer; its tokenizer_path, when set, names the tokenizer's
      directory. None: no overrides, no remote code, the tokenizer of model_path.
    topology: the job's Topology (`config.derived.topology`), whose actor / ref / rollout layouts give this rank's
      meshes; None computes the same layouts from actor, ref and rollout over this group's world.
    Subclasses call `super().__init__(...)` first: it joins the group's torch.distributed world, which an engine
    built afterwards (vLLM included) then shares.
    """

    def __init__(
        self,
        model_path: str,
        actor: ActorConfig,
        rollout: RolloutConfig,
        ref: RefConfig | None = None,
        total_training_steps: int | None = None,
        seed: int = 0,
        model: ModelConfig | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.actor_config = actor
        self.rollout_config = rollout
        self.ref_config = ref
        self.override_config = dict(model.override_config) if model is not None else {}
        self.trust_remote_code = model.trust_remote_code if model is not None else False
        tokenizer_dir = model.tokenizer_path if model is not None and model.tokenizer_path else self.model_path
        self.lora = lora_settings(model)
        self.lora_merge = model is not None and model.lora.merge
        self.engine_config = actor_engine_config(
            actor, self.model_path, total_training_steps=total_training_steps, seed=seed,
            override_config=self.override_config, trust_remote_code=self.trust_remote_code, lora=self.lora,
        )
        self.topology = topology or actor_group_topology(self.world_size, actor, ref, rollout)
        self._register_meshes(self.topology)
        warning = stale_policy_warning(type(self))
        if warning:
            logger.warning(warning)
        self.init_distributed()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=self.trust_remote_code)
        self.actor: PPOActor | None = None
        self.ref: ReferencePolicy | None = None
        # The rollout side, chosen once by init_model from the topology (workers/colocated_rollout.py): this
        # process's engine, or the link to the servers.
        self._rollout_side: ColocatedRolloutComponent | ServerRolloutLink | None = None
        self.transport: WeightTransport | None = None  # actor -> rollout weights (resharding/transports)
        self._synced_step: int | None = None  # the actor step whose weights the rollout engine holds
        self._version = WeightVersion()  # the policy version those weights are (workers/weight_version.py)
        self._log_prob_budget: int | None = None  # size_token_budgets: the old log-probs' sized budget

    @property
    def rollout(self) -> RolloutEngine | None:
        """This rank's rollout engine (None before init_model, in server mode, or with a user's text hook)."""
        return self._rollout_side.engine if self._rollout_side is not None else None

    # ----- overridable hooks -----

    def build_rollout_engine(self) -> RolloutEngine:
        """The rollout engine of this rank: the one rollout.name's registry entry builds (config/rollout_backends.py:
        vLLM in-process, HF `generate`, or a registered backend); override to use your own."""
        serves_adapter = self.lora is not None and not self.lora_merge
        return build_rollout_engine(EngineBuild(
            self.model_path, self.rollout_config, self.hf_config(), self.override_config, self.trust_remote_code,
            lora_rank=self.lora.rank if serves_adapter else 0,
        ))

    def hf_config(self) -> Any:
        """The policy's HF config with actor_rollout_ref.model.override_config applied."""
        return load_hf_config(
            self.model_path, trust_remote_code=self.trust_remote_code, override_config=self.override_config,
            key="actor_rollout_ref.model.override_config",
        )

    def generate(self, prompts: list[str]) -> list[str]:
        """Text hook: one response text per prompt text (prompts repeat n times when rollout.n > 1).

        Override it to generate with your own engine. The framework tokenizes each returned text (no special
        tokens added) into the response, truncated to rollout.response_length; end a finished text with the
        tokenizer's eos token so that the response carries it. Not called unless overridden.
        """
        raise NotImplementedError("ActorRolloutWorker.generate is a hook for subclasses")

    def update_rollout_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Weight hook: (HF name, full tensor) pairs of the current policy, streamed one parameter at a time.

        Called on every rank (consume the iterable completely: producing it is a collective) after each actor
        update, before the next rollout. Default: the rollout engine's own `load_weights`. Override it when
        `generate` uses an engine of your own.
        """
        self._require(self.rollout, "update_rollout_weights").load_weights(named_tensors)

    # ----- registered methods -----

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, float]:
        """Builds the actor's engine (and the reference's; engine/factory.py picks FSDP2 or Megatron by strategy), the
        rollout engine, and syncs the actor's weights into it. Returns where the time went ("startup/*" seconds:
        actor_engine_s, ref_engine_s, vllm_import_s, rollout_engine_s, first_sync_s; the trainer logs them with its
        first step)."""
        clock = time.perf_counter()
        startup: dict[str, float] = {}

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            startup[f"startup/{name}_s"] = now - clock
            clock = now

        actor_config = self.actor_config
        engine = build_engine(self.engine_config, actor_config.strategy, actor_config.megatron)
        self.actor = PPOActor(engine, actor_config, rollout_n=self.rollout_config.n)
        lap("actor_engine")
        if self.ref_config is not None and engine.lora_enabled:
            self.ref = ReferencePolicy(engine, adapter_disabled=True)  # the actor's base: no second copy
        elif self.ref_config is not None:
            ref_engine = reference_engine_config(self.engine_config, self.ref_config)
            ref = self.ref_config
            self.ref = ReferencePolicy(build_engine(
                ref_engine, ref.strategy or actor_config.strategy, ref.megatron or actor_config.megatron
            ))
            self.ref.engine.offload()
            lap("ref_engine")
        if self.topology.rollout is None:
            # The rollout lives in servers; connect_rollout_servers() builds the transport to them.
            self._rollout_side = ServerRolloutLink(self.rollout_config)
            self.actor.engine.offload()
            logger.info("rank %d: actor ready (rollout in servers; %s)", self.rank, startup)
            return startup
        engine, text_hook = None, None
        if type(self).generate is ActorRolloutWorker.generate:
            package = rollout_backend(self.rollout_config.name).package
            if package is not None:
                importlib.import_module(package)  # timed on its own: seconds of imports before the engine starts
                lap(f"{package.replace('.', '_')}_import")
            engine = self.build_rollout_engine()
        else:
            text_hook = self.generate
        self._rollout_side = ColocatedRolloutComponent(engine, self.rollout_config, self.topology.rollout, self.rank,
                                                       self.tokenizer, text_hook, owner=type(self).__name__)
        self.transport = self._colocated_transport()
        lap("rollout_engine")
        # A dummy-initialised vLLM must get the weights before it generates; loading them once more is cheap.
        metrics = self._sync_weights()
        self._sleep_rollout()
        self.actor.engine.offload()
        lap("first_sync")
        logger.info("rank %d: actor and rollout ready (%s; %s)", self.rank, metrics, startup)
        return startup

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def size_token_budgets(self, passes: list[str], longest_sequence: int, timeout_s: float) -> dict[str, int]:
        """Sizes the null token budgets of `passes` from free device memory, the same on every rank, and uses them
        from now on (engine/token_budget.py); returns them by pass. The driver calls it once at start-up."""
        from verl_like.config.token_budget import LOG_PROB, REF_LOG_PROB, UPDATE
        from verl_like.engine.token_budget import size_engine_budgets

        engine = self._require(self.actor, "size_token_budgets").engine
        ref = self.ref.engine if self.ref is not None and self.ref.engine is not engine else None  # LoRA: the actor
        agreed = size_engine_budgets([p for p in passes if p != REF_LOG_PROB or ref is not None], engine, ref,
                                     longest_sequence, timeout_s, "actor_rollout.size_token_budgets")
        for name, target in ((UPDATE, engine), (REF_LOG_PROB, ref)):
            if name in agreed:
                target.set_token_budget(agreed[name])
        self._log_prob_budget = agreed.get(LOG_PROB)
        return agreed

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def connect_rollout_servers(self, addresses: list[str], pause_mode: str | None = None,
                                weight_transfer: str = "gloo") -> dict[str, float]:
        """Server mode: links this group to the vLLM servers at `addresses` (rank 0 sends, through vLLM's
        weight-transfer API) and sends the current weights once (again after a server restarted: a new group, a
        full sync); weight_sync/* metrics. pause_mode: what in-flight
        requests do during an update ("abort" or "keep"; default rollout.server.pause_mode). weight_transfer:
        "gloo" or "ipc", the servers' engine (config/placement.py:RolloutPlacement.weight_transfer resolves auto)."""
        from verl_like.rollout.backends import server_backend
        from verl_like.utils.device import node_ip_address

        engine = self._require(self.actor, "connect_rollout_servers").engine
        config = self.rollout_config
        options = server_transport_options(
            config, engine, address=node_ip_address(), pause_mode=pause_mode, weight_transfer=weight_transfer,
            vision=getattr(self.hf_config(), "vision_config", None) is not None, backend=server_backend(config.name),
        )
        if self.transport is not None:  # linking again (a restarted server): the old group goes first
            self.transport.close()
            self.transport = None
        serves_adapters = self.lora is not None and not self.lora_merge  # adapter-only: the base once, then it
        link = ServerLink(tuple(addresses), options, serves_adapters, self.lora.rank if serves_adapters else 0)
        self.transport = build_transport(engine, config, servers=link)
        self._synced_step = None
        return self._sync_weights()

    @register(dispatch=Dispatch.DP_MESH, mesh="rollout")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Rollout batch for this TP group's chunk of prompts (layout in `RolloutEngine`).

        meta_info: a `GenerationRequest` (rollout/request.py): "validate" uses rollout.val_kwargs; "do_sample":
        False decodes greedily (one sample); "seed" seeds the sampling of this call (prompt i of the whole batch
        draws from seed + i * n).
        The engine must hold the actor's current weights: after `update_actor` call `sync_weights` first (the
        driver owns that decision; a stale engine raises instead of syncing behind its back). Weights that the
        engine's sleep discarded come back with its wake-up. Adds meta_info["temperature"] and metrics
        rollout/tokens_per_s (all ranks' tokens over the slowest rank's time), and weight_sync/* when a wake-up
        reloaded discarded weights.
        """
        actor = self._require(self.actor, "generate_sequences")
        side = self._require(self._rollout_side, "generate_sequences")
        sampling = side.sampling(prompts)  # server mode refuses here: the driver generates
        self._check_rollout_current(actor.engine.global_step)
        metrics = self._wake_rollout()
        start = time.perf_counter()
        try:
            out = side.generate(prompts, sampling, self._version.number)
        finally:
            self._sleep_rollout()
        metrics.update(side.global_rollout_rate(out, time.perf_counter() - start))
        out.meta_info.update(TrainRequest(temperature=sampling.log_prob_temperature).to_meta_info())
        out.meta_info["metrics"] = {**out.meta_info.get("metrics", {}), **metrics}
        return out

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def configure_agent_loops(self, config: dict[str, Any], registry: dict[str, dict[str, Any]]) -> None:
        """Runs this rank's rollouts through agent loops from now on (docs/agents.md): `config` is the run's whole
        config as plain containers (what the loops read as `self.config`), `registry` the driver's loop names."""
        from omegaconf import OmegaConf

        from verl_like.experimental.agent_loop.runner import AgentLoopRunner

        side = self._require(self._rollout_side, "configure_agent_loops")
        side.agent_runner = AgentLoopRunner(OmegaConf.create(config), self.tokenizer, registry=registry)

    @register(dispatch=Dispatch.DP_MESH, mesh="actor")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """"old_log_probs" and "entropy" `(batch, response_len)` under the current actor, at the rollout's
        temperature (meta_info["temperature"], else rollout.temperature); with "rollout_log_probs" in the batch
        also metrics rollout/logprob_diff_mean and rollout/logprob_diff_max (|rollout - old| on response
        tokens, over every rank). A text-hook worker's rollout has no log-probs: this call adds its
        "rollout_log_probs", equal to "old_log_probs" on response tokens (the same forward)."""
        actor = self._require(self.actor, "compute_log_prob")
        temperature = self._train_request(data).temperature
        micro_batching = log_prob_micro_batching(self.rollout_config, actor.engine.config, self._log_prob_budget)
        with self._onloaded(actor.engine):
            out = actor.compute_log_prob(data, temperature=temperature, calculate_entropy=True,
                                         micro_batching=micro_batching)
        out.meta_info.update(TrainRequest(temperature=temperature).to_meta_info())
        if self._scores_text_rollouts(data):
            # One forward for both: the text hook's samples have no log-probs of their own, and the rollout's are
            # the actor's under the weights that generated them (the driver syncs after each update, not before).
            out.batch["rollout_log_probs"] = out.batch["old_log_probs"] * response_mask_of(data.batch)
            out.meta_info["metrics"] = {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0}
        elif "rollout_log_probs" in data.batch.keys():
            out.meta_info["metrics"] = self._log_prob_diff(data, out.batch["old_log_probs"])
        return out

    @register(dispatch=Dispatch.DP_MESH, mesh="ref")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """"ref_log_probs" `(batch, response_len)` under the reference policy (meta_info["temperature"])."""
        ref = self._require(self.ref, "compute_ref_log_prob", "build the worker with ref=RefConfig(...)")
        with self._onloaded(ref.engine):
            return ref.compute_ref_log_prob(data, temperature=self._train_request(data).temperature)

    @register(dispatch=Dispatch.DP_MESH, mesh="actor")
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO epochs on this rank's rows (PPOActor.update_policy); a rowless DataProto with meta_info["metrics"]:
        the update's, and this process's memory since its previous update (perf/max_memory_allocated_gb,
        perf/max_memory_reserved_gb on CUDA, perf/cpu_memory_used_gb; utils/device.peak_memory_metrics).

        The rollout engine keeps the old weights until `sync_weights`; generating before it raises.
        """
        actor = self._require(self.actor, "update_actor")
        with self._onloaded(actor.engine):
            metrics = actor.update_policy(data, self._train_request(data))
        return DataProto(meta_info={"metrics": {**metrics, **peak_memory_metrics()}})

    @register(dispatch=Dispatch.DP_MESH, mesh="actor")
    def update_actor_dpo(self, data: DataProto) -> DataProto:
        """Online-DPO update on this rank's (chosen, rejected) rows (workers/dpo_update.py); meta_info["online_dpo"]
        is the OnlineDPOConfig. Returns a rowless DataProto with meta_info["metrics"]."""
        from verl_like.workers.dpo_update import update_policy_dpo

        actor = self._require(self.actor, "update_actor_dpo")
        with self._onloaded(actor.engine):
            metrics = update_policy_dpo(actor, data, data.meta_info["online_dpo"])
        return DataProto(meta_info={"metrics": {**metrics, **peak_memory_metrics()}})

    @register(dispatch=Dispatch.DP_MESH, mesh="actor")
    def update_actor_distill(self, data: DataProto) -> DataProto:
        """The actor's update with the distillation term (workers/distill_update.py); meta_info["distillation"] is
        the DistillationConfig. Returns a rowless DataProto with meta_info["metrics"]."""
        from verl_like.workers.distill_update import update_policy_distill

        actor = self._require(self.actor, "update_actor_distill")
        with self._onloaded(actor.engine):
            metrics = update_policy_distill(actor, data, data.meta_info["distillation"], self._train_request(data))
        return DataProto(meta_info={"metrics": {**metrics, **peak_memory_metrics()}})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_weights(self) -> dict[str, float]:
        """Moves the actor's weights into the rollout engine; weight_sync/* metrics of this rank (weight_sync/version:
        the policy version it now holds, workers/weight_version.py)."""
        return self._sync_weights()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Writes the actor's sharded model, optimizer, scheduler and RNG state to `directory`."""
        actor = self._require(self.actor, "save_checkpoint")
        with self._onloaded(actor.engine):
            actor.engine.save_checkpoint(Path(directory))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str, weight_version: int | None = None) -> None:
        """Restores the actor from `directory` and syncs the restored weights into the rollout engine, as policy
        version `weight_version` (the driver's checkpointed count; None: the next version)."""
        actor = self._require(self.actor, "load_checkpoint")
        with self._onloaded(actor.engine):
            actor.engine.load_checkpoint(Path(directory))
        if weight_version is not None:
            self._version = WeightVersion(weight_version, actor.engine.global_step)
        self._synced_step = None
        self._sync_weights()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def close(self) -> None:
        """Shuts the rollout engine down cleanly (frees its shared memory; a killed process leaks it). Call it
        before the group's shutdown; the worker takes no more calls (vLLM's shutdown ends the process group)."""
        if self.transport is not None:
            self.transport.close()
        self.transport = None
        if self._rollout_side is not None:
            self._rollout_side.close()

    # ----- internals -----

    def _register_meshes(self, topology: Topology) -> None:
        """The dispatch meshes of this rank: "actor", "ref" (the actor's when no reference runs, so that a call
        reaches the worker and says what is missing) and, colocated, "rollout"."""
        layouts = {"actor": topology.actor, "ref": topology.ref or topology.actor, "rollout": topology.rollout}
        for name, layout in layouts.items():
            if layout is None:
                continue
            if layout.world_size != self.world_size:
                raise ValueError(
                    f"{type(self).__name__}: the {name} topology spans {layout.world_size} ranks but this group has "
                    f"{self.world_size}; build the Topology from the same trainer.nnodes * trainer.n_gpus_per_node"
                )
            dp_rank, dp_size, is_collect = layout.mesh(self.rank)
            self.register_mesh(name, dp_rank=dp_rank, dp_size=dp_size, is_collect=is_collect)

    def _train_request(self, data: DataProto) -> TrainRequest:
        """The batch's TrainRequest, its temperature the one its rollout sampled at (which generate_sequences
        writes), else rollout.temperature: log-probs must be taken at it."""
        request = TrainRequest.from_meta_info(data.meta_info)
        if request.temperature is None:
            request = dataclasses.replace(request, temperature=self.rollout_config.temperature)
        return request

    @staticmethod
    def _require(value, op: str, fix: str = "call init_model() on the group first"):
        if value is None:
            raise RuntimeError(f"ActorRolloutWorker.{op}: not available; {fix}")
        return value

    @contextmanager
    def _onloaded(self, engine: TrainEngine) -> Iterator[None]:
        engine.onload()
        try:
            yield
        finally:
            engine.offload()

    def _colocated_transport(self) -> WeightTransport | None:
        """resharding/transports/factory.py picks it; the user's update_rollout_weights hook, if overridden, wins
        (None for a text hook without a weight hook: warned about at construction)."""
        engine = self._require(self.actor, "init_model").engine
        overridden = type(self).update_rollout_weights is not ActorRolloutWorker.update_rollout_weights
        return build_transport(engine, self.rollout_config, rollout=self.rollout, hf_config=self.hf_config,
                               hook=self.update_rollout_weights if overridden else None)

    def _check_rollout_current(self, actor_step: int) -> None:
        """Raises unless the rollout engine holds the weights of `actor_step` (no transport: the user's text hook
        keeps its own weights, as warned at construction)."""
        if self.transport is None or self._synced_step == actor_step:
            return
        held = "no weights of the actor" if self._synced_step is None else f"the weights of step {self._synced_step}"
        raise RuntimeError(
            f"ActorRolloutWorker.generate_sequences: the rollout engine holds {held} but the actor is at step "
            f"{actor_step}; call sync_weights() on the group after update_actor (the driver owns the weight sync)"
        )

    def _sync_weights(self) -> dict[str, float]:
        """The one place weights move to the rollout: init, the driver's sync_weights, resume, and the wake-up of
        an engine whose sleep discarded them."""
        actor = self._require(self.actor, "sync_weights")
        if self.transport is None:
            return {}
        side = self._require(self._rollout_side, "sync_weights")
        side.before_sync(self.transport)
        step = actor.engine.global_step
        version = self._version.of_sync(step)
        with self._onloaded(actor.engine):
            metrics = self.transport.send(version=version).metrics()
            # rollout/sync_check.py on this rank's engine or against the servers: rollout/sync_check_gap
            metrics.update(side.sync_check(actor.engine, self.transport, version, lambda: self.hf_config().vocab_size))
        self._synced_step = step
        self._version.synced(step, version)
        side.after_sync()
        return {**metrics, "weight_sync/version": float(version)}

    def _wake_rollout(self) -> dict[str, float]:
        """Wakes the engine for generation; weight_sync/* metrics when its weights had to be loaded again."""
        side = self._rollout_side
        if side is None:
            return {}
        # Not a sync decision: the same version again, because sleep threw it away (vLLM's sleep level 2).
        metrics = self._sync_weights() if side.reloads_on_wake else {}
        side.wake()
        return metrics

    def _sleep_rollout(self) -> None:
        if self._rollout_side is not None:
            self._rollout_side.sleep()

    def _scores_text_rollouts(self, data: DataProto) -> bool:
        """Whether `data` is a text-hook rollout that compute_log_prob completes with "rollout_log_probs"."""
        return self._rollout_side is not None and self._rollout_side.scores_text_rollouts(data)

    def _log_prob_diff(self, data: DataProto, old_log_probs: torch.Tensor) -> dict[str, float]:
        """rollout/logprob_diff_{mean,max} over every response token of every rank; for a batch with images
        (docs/vision.md) also rollout/image_logprob_diff_{mean,max} over the rows that have an image. The same
        computation and reduction as the update's when its forward gives the old log-probs (workers/actor.py)."""
        mask = response_mask_of(data.batch)
        shares, peaks = rollout_gaps(old_log_probs, data.batch, mask)
        entries = {**metric_entries(shares, {}, mask), **peaks}
        group = self._require(self.actor, "compute_log_prob").engine.dp_group
        return gap_metrics(reduce_metrics({name: [float(value)] for name, value in entries.items()}, group))
