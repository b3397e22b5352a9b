"""`PPOTrainer`: the single-controller RL loop (PPO, GRPO, RLOO, REINFORCE++, DAPO, ReMax).

One step: rollout → reward (rule scorers and/or the reward-model role, trainer/rewarding.py) → reorder for
balanced data-parallel ranks (trainer.balance_batch) → old and reference log-probs → values → advantages →
critic and actor updates → weight sync into the rollout engine. The driver holds no model weights; it moves
DataProto batches and metrics.

Departures from the published methods live in the algorithm functions (docs/algorithms.md); the loop itself
follows verl's order of phases, with one difference: the weight sync runs right after the actor update (not at
the start of the next rollout), so a checkpoint always matches the weights the rollout engine holds.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_like.algorithms import (
    AdvantageConfig,
    AdvantageInputs,
    apply_kl_penalty,
    apply_overlong_penalty,
    build_kl_controller,
    compute_advantage,
    compute_rollout_is_weights,
    filter_zero_variance_groups,
)
from verl_like.config.fused_kernels import resolve_fused_kernels
from verl_like.config.old_log_prob import resolve_old_log_prob
from verl_like.config.rollout_log_probs import resolve_calculate_log_probs
from verl_like.protocol import DataProto
from verl_like.rollout.request import GenerationRequest
from verl_like.rollout.trajectory import infra_failed_rows
from verl_like.trainer.async_rollout import RolloutPrefetcher
from verl_like.trainer.balance import balance_batch
from verl_like.trainer.checkpoint import CheckpointManager, rng_state, set_rng_state
from verl_like.trainer.interrupts import StopRequests, TrainingInterrupted
from verl_like.trainer.metrics import ToolCallWatch
from verl_like.trainer.metrics import data_metrics, mean_metrics, mfu_metrics, throughput_metrics, timed
from verl_like.trainer.phases import StepContext, select_update_phase
from verl_like.trainer.progress import Progress
from verl_like.trainer.rewarding import BatchScorer
from verl_like.trainer.rollout_dump import dump_rollouts, remove_stale_temp_files
from verl_like.trainer.run_summary import RunRecord
from verl_like.trainer.setup import TrainerComponents, build_components
from verl_like.trainer.val_generations import ValGenerationLogger, ValSample, decode_samples
from verl_like.utils.device import resolve_device
from verl_like.utils.flops import resolve_peak_tflops
from verl_like.utils.tracking import Tracking
from verl_like.workers.train_request import ROLLOUT_IS_KEY, TrainRequest

logger = logging.getLogger(__name__)


class PPOTrainer:
    """Drives the worker groups through `config.trainer.total_training_steps` RL steps.

    `actor_rollout_worker` is the worker class holding actor, rollout and reference (a subclass of
    `ActorRolloutWorker` plugs in another rollout engine); `actor_rollout_kwargs` are extra constructor arguments
    for it. `critic_worker` / `reward_model_worker` replace CriticWorker / RewardModelWorker (the latter runs with
    reward_model.enable). `reward_fn(data_source, solution_str, ground_truth, extra_info) -> float` replaces the
    rule scorers.
    """

    def __init__(
        self,
        config: Any,
        actor_rollout_worker: type | None = None,
        actor_rollout_kwargs: dict[str, Any] | None = None,
        critic_worker: type | None = None,
        reward_fn: Any = None,
        reward_model_worker: type | None = None,
    ) -> None:
        # load_config decided the null auto keys already; a PPOConfig built by hand is decided here.
        self.config = config = resolve_calculate_log_probs(resolve_old_log_prob(resolve_fused_kernels(config)))
        self._actor_rollout_worker = actor_rollout_worker
        self._actor_rollout_kwargs = dict(actor_rollout_kwargs or {})
        self._critic_worker = critic_worker
        self._reward_fn = reward_fn
        self._reward_model_worker = reward_model_worker
        self._scorer: BatchScorer | None = None
        self.last_val_samples: list[ValSample] = []
        self.components: TrainerComponents | None = None
        self.global_step = 0
        algo = config.algorithm
        self.kl_ctrl = build_kl_controller(algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, algo.kl_ctrl.target_kl, algo.kl_ctrl.horizon)
        # Absolute: the workers write the checkpoint parts, and their working directory need not be the driver's.
        self.run_dir = Path(config.trainer.default_local_dir).absolute()
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints",
            part_limits={"actor": config.trainer.max_actor_ckpt_to_keep, "critic": config.trainer.max_critic_ckpt_to_keep},
        )
        dump_dir = config.trainer.rollout_data_dir
        self.rollout_data_dir = Path(dump_dir).expanduser().absolute() if dump_dir is not None else None
        self.tracking: Tracking | None = None
        self._prefetcher: RolloutPrefetcher | None = None
        self._staleness_counts: dict[int, int] = {}
        self._resume_mode: str | None = None  # "auto" after restart_workers()

    # ------------------------------------------------------------------ setup
    def init_workers(self) -> None:
        """Builds data, reward manager and worker groups (Ray must be initialised)."""
        self.components = build_components(
            self.config,
            actor_rollout_worker=self._actor_rollout_worker,
            actor_rollout_kwargs=self._actor_rollout_kwargs,
            critic_worker=self._critic_worker,
            reward_fn=self._reward_fn,
            reward_model_worker=self._reward_model_worker,
        )
        self._scorer = BatchScorer(
            self.components.reward_manager, self.components.reward_model, self.config.reward_model.combine
        )

    @property
    def _c(self) -> TrainerComponents:
        if self.components is None:
            raise RuntimeError("call PPOTrainer.init_workers() before fit()")
        return self.components

    def restart_workers(self) -> None:
        """After a worker died (trainer.max_restarts, trainer/restarts.py): releases every group and starts them
        again; the next fit() resumes from the newest checkpoint of this run (the configured resume_mode when this
        run wrote none yet)."""
        self.shutdown()
        self.global_step = 0
        self._staleness_counts = {}
        self._resume_mode = "auto" if self.checkpoints.latest_step(required_parts=["actor"]) is not None else None
        self.init_workers()

    def _resume(self) -> None:
        mode = self._resume_mode or self.config.trainer.resume_mode
        if mode == "disable":
            return
        if mode == "resume_path":
            path = Path(self.config.trainer.resume_from_path)
            step = int(path.name.removeprefix("global_step_"))
            manager = CheckpointManager(path.parent)
        else:
            manager = self.checkpoints
            step = manager.latest_step(required_parts=["actor"] + (["critic"] if self._c.critic is not None else []))
            if step is None:
                logger.info("resume_mode=auto: no checkpoint under %s, starting fresh", manager.root)
                return
        parts = ["actor"] + (["critic"] if self._c.critic is not None else [])
        missing = [part for part in parts if not (manager.step_dir(step) / part).is_dir()]
        if missing:
            raise FileNotFoundError(
                f"checkpoint {manager.step_dir(step)} has no {missing} folder (rotated out by "
                "trainer.max_actor_ckpt_to_keep / max_critic_ckpt_to_keep?); resume from a newer step"
            )
        state = manager.load_trainer_state(step)
        # A checkpoint written before the count was stored: every step after the critic's warm-up synced once.
        version = state.get("weight_version", max(0, step - self.config.trainer.critic_warmup))
        self._c.rollout.load_checkpoint(str(manager.step_dir(step) / "actor"), version)
        if self._c.critic is not None:
            self._c.critic.load_checkpoint(str(manager.step_dir(step) / "critic"))
        self._c.train_loader.load_state_dict(state["dataloader"])
        self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(state["rng"])
        self.global_step = step
        logger.info("resumed from %s at step %d", manager.step_dir(step), step)

    def _save_checkpoint(self) -> Path:
        """Writes the checkpoint of the current step; raises CheckpointSaveError (previous one intact) on failure."""

        def write_parts(staging: Path) -> None:
            self._c.actor_rollout.save_checkpoint(str(staging / "actor"))
            if self._c.critic is not None:
                self._c.critic.save_checkpoint(str(staging / "critic"))

        state = {
            "step": self.global_step,
            "dataloader": (self._prefetcher.loader_state() if self._prefetcher is not None
                           else self._c.train_loader.state_dict()),
            "kl_coef": float(self.kl_ctrl.value),
            "rng": rng_state(),
            "weight_version": self._c.rollout.weight_version,
        }
        return self.checkpoints.save(self.global_step, write_parts, state)

    def _checkpoint_on_stop(self) -> str | None:
        """The checkpoint of the current step, written now unless it exists (None with save_freq=-1 or at step 0)."""
        if self.config.trainer.save_freq < 0 or self.global_step == 0:
            return None
        directory = self.checkpoints.step_dir(self.global_step)
        if not directory.is_dir():
            directory = self._save_checkpoint()
        return str(directory)

    # ------------------------------------------------------------------ phases
    def _rollout(self, prompts: DataProto, step: int, attempt: int = 0) -> DataProto:
        """The rollout of `prompts` for training step `step` (the asynchronous driver calls it ahead of time)."""
        prompts.non_tensor_batch["uid"] = np.array([uuid.uuid4().hex for _ in range(len(prompts))], dtype=object)
        # Seeded by step (and dynamic-sampling attempt) so a resumed run samples what the uninterrupted one did.
        base = self.config.actor_rollout_ref.rollout.seed
        seed = (base * 1_000_003 + step * 7_919 * 131 + attempt * 104_729) % 2**31
        prompts.meta_info.update(GenerationRequest(seed=seed).to_meta_info())
        return self._c.rollout.generate(prompts)

    def _generate(self, prompts: DataProto, timings: dict[str, float], attempt: int = 0) -> DataProto:
        with timed(timings, "gen"):
            return self._rollout(prompts, self.global_step, attempt)

    def _prefetched(self, timings: dict[str, float], metrics: dict[str, float]) -> DataProto:
        """The asynchronous driver's batch for this step (generated in the background, at most K versions old),
        with its TrainRequest: its version and lr_scale, the factor on the actor's learning rate for its lag."""
        got = self._prefetcher.next(self.global_step, version=self._c.rollout.weight_version)
        lag = self._c.rollout.weight_version - got.version
        self._staleness_counts[lag] = self._staleness_counts.get(lag, 0) + 1
        timings["gen_wait"] = got.wait_s
        lr_scale = self.config.async_training.lr_scale(lag)
        got.batch.meta_info.update(TrainRequest(lr_scale=lr_scale, weight_version=got.version).to_meta_info())
        metrics.update({
            "async/weight_version": float(got.version),
            "async/staleness": float(lag),
            "async/lr_scale": lr_scale,
            "async/generate_s": got.generate_s,
            "async/overlap_fraction": max(0.0, 1.0 - got.wait_s / got.generate_s) if got.generate_s > 0 else 0.0,
            **{f"async/staleness_count/{k}": float(v) for k, v in sorted(self._staleness_counts.items())},
        })
        return got.batch

    @property
    def _batch_scorer(self) -> BatchScorer:
        if self._scorer is None:
            raise RuntimeError("call PPOTrainer.init_workers() before fit()")
        return self._scorer

    def _score(self, batch: DataProto, timings: dict[str, float], metrics: dict[str, float]) -> DataProto:
        """Adds token_level_scores (rule and/or reward model, plus the overlong penalty), rm_scores with a reward
        model, and "acc" (the rule score per sequence, which DAPO's filter may compare)."""
        with timed(timings, "reward"):
            scored = self._batch_scorer.score(batch)
        metrics.update(scored.metrics)
        scores = scored.scores
        if scored.rm_scores is not None:
            batch.batch["rm_scores"] = scored.rm_scores
        if scored.rule_scores is not None:
            batch.batch["acc"] = scored.rule_scores.sum(-1)
        overlong = self.config.reward_model.overlong_buffer
        if overlong.enable:
            scores, penalty = apply_overlong_penalty(
                scores,
                batch.batch["response_mask"],
                max_response_length=self.config.data.max_response_length,
                overlong_buffer_len=overlong.len,
                penalty_factor=overlong.penalty_factor,
            )
            metrics["reward/overlong_penalty_mean"] = penalty.double().mean().item()
        batch.batch["token_level_scores"] = scores
        return batch

    def _collect_rollouts(self, timings: dict[str, float], metrics: dict[str, float]) -> DataProto:
        """The step's generated and scored batch (what it trains on), written to trainer.rollout_data_dir if set."""
        batch = self._generate_and_score(timings, metrics)
        if self.rollout_data_dir is not None:
            # The synchronous path generates with the current policy; the async driver records its batch's version.
            version = TrainRequest.from_meta_info(batch.meta_info).weight_version
            version = self._c.rollout.weight_version if version is None else version
            with timed(timings, "dump_rollouts"):
                dump_rollouts(self.rollout_data_dir, batch, self._c.tokenizer, self.global_step + 1, version)
        return batch

    def _generate_and_score(self, timings: dict[str, float], metrics: dict[str, float]) -> DataProto:
        """Generates and scores one step's batch; with DAPO dynamic sampling, keeps only groups with reward
        variance and generates more prompts until `train_batch_size` groups are kept (bounded)."""
        filters = self.config.algorithm.filter_groups
        if self._prefetcher is not None:
            return self._score(self._prefetched(timings, metrics), timings, metrics)
        if not filters.enable:
            return self._score(self._generate(self._c.train_loader.next_batch(), timings), timings, metrics)
        n = self.config.actor_rollout_ref.rollout.n
        wanted = self.config.data.train_batch_size
        kept: list[DataProto] = []
        kept_groups = scored_samples = failed_samples = 0
        for attempt in range(1, filters.max_num_gen_batches + 1):
            batch = self._score(self._generate(self._c.train_loader.next_batch(), timings, attempt), timings, metrics)
            scored_samples += len(batch)
            failed_samples += metrics.get("reward/errors", 0)
            if filters.metric == "acc":
                values = batch.batch["acc"]
            else:
                values = batch.batch["token_level_scores"].sum(-1)
            result = filter_zero_variance_groups(batch.non_tensor_batch["uid"], values)
            kept.append(batch[result.keep_mask.numpy()])
            kept_groups += result.num_kept_groups
            if kept_groups >= wanted:
                metrics["dynamic_sampling/gen_batches"] = attempt
                return DataProto.concat(kept)[: wanted * n]
        cause = (
            f"{failed_samples:g} of the {scored_samples} samples scored failed (reward/errors), so their equal 0 "
            "rewards have no variance: fix the reward function (reward_model.error_policy="
            f"{self.config.reward_model.error_policy} let them through)"
            if failed_samples > scored_samples / 2
            else "raise max_num_gen_batches, or the task is too easy/hard for the policy (all-equal rewards)"
        )
        raise RuntimeError(
            f"dynamic sampling kept {kept_groups} of the {wanted} groups needed after "
            f"algorithm.filter_groups.max_num_gen_batches={filters.max_num_gen_batches} generation batches; {cause}"
        )

    def _compute_advantages(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        algo = self.config.algorithm
        mask = batch.batch["response_mask"]
        scores = batch.batch["token_level_scores"]
        if algo.use_kl_in_reward:
            rewards, kl_metrics = apply_kl_penalty(
                scores, batch.batch["old_log_probs"], batch.batch["ref_log_probs"], mask,
                kl_ctrl=self.kl_ctrl, kl_penalty=algo.kl_penalty,
            )
            metrics.update({f"critic/{k}": v for k, v in kl_metrics.items()})
        else:
            rewards = scores
        batch.batch["token_level_rewards"] = rewards
        inputs = AdvantageInputs(
            token_level_rewards=rewards,
            response_mask=mask,
            index=_baseline_groups(batch),
            values=batch.batch["values"] if "values" in batch.batch.keys() else None,
            reward_baselines=batch.batch["reward_baselines"] if "reward_baselines" in batch.batch.keys() else None,
        )
        cfg = AdvantageConfig(gamma=algo.gamma, lam=algo.lam, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo)
        advantages, returns = compute_advantage(algo.adv_estimator, inputs, cfg)
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch

    def _remax_baselines(self, batch: DataProto, timings: dict[str, float], metrics: dict[str, float]) -> torch.Tensor:
        """ReMax: the reward of the greedy response to each prompt, repeated over its n samples."""
        n = self.config.actor_rollout_ref.rollout.n
        first = batch[np.arange(0, len(batch), n)]
        prompt_len = first.batch["prompts"].shape[1]
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": first.batch["prompts"],
                "attention_mask": first.batch["attention_mask"][:, :prompt_len],
                "position_ids": first.batch["position_ids"][:, :prompt_len],
            },
            non_tensors=dict(first.non_tensor_batch),
            meta_info=GenerationRequest(greedy=True).to_meta_info(),
        )
        with timed(timings, "gen_greedy"):
            greedy = self._c.rollout.generate(prompts)
        greedy.meta_info.pop("metrics", None)
        return self._batch_scorer.score(greedy).scores.sum(-1).repeat_interleave(n)

    # ------------------------------------------------------------------ loop
    def train_step(self) -> dict[str, float]:
        """One RL step: the rollout phase, then the run's update phase (trainer/phases.py); returns its metrics."""
        timings: dict[str, float] = {}
        metrics: dict[str, float] = {}
        c = self._c
        name, update = select_update_phase(self.config, self._ppo_update)
        with timed(timings, "step"):
            batch = self._collect_rollouts(timings, metrics)
            metrics.update(mean_metrics(batch.meta_info.pop("metrics", {})))
            batch = update(StepContext(self.config, c, self.global_step), batch, timings, metrics)
        metrics.update(throughput_metrics(batch, timings, c.world_size))
        metrics.update({f"timing_s/{k}": v for k, v in timings.items()})
        if name == "ppo":  # the batch has advantages and returns (online DPO's pair metrics are its own)
            metrics.update(data_metrics(batch, self.config.data.max_response_length))
            metrics.update(self._mfu_metrics(batch, timings))
            metrics["actor/kl_coef"] = float(self.kl_ctrl.value)
        return metrics

    def _ppo_update(self, ctx: StepContext, batch: DataProto, timings: dict[str, float],
                    metrics: dict[str, float]) -> DataProto:
        """The PPO-family update phase (distillation's teacher term a hook of it): log-probs, values, advantages,
        the critic's and actor's updates and the weight sync. Returns the batch it trained on."""
        cfg, c = ctx.config, ctx.components
        if cfg.algorithm.adv_estimator == "remax":
            batch.batch["reward_baselines"] = self._remax_baselines(batch, timings, metrics)
        if cfg.trainer.balance_batch:  # after ReMax, whose greedy pass reads the rollout's group order
            batch, balance_metrics = balance_batch(batch, c.actor_dp_size or c.world_size)
            metrics.update(balance_metrics)
        # A rollout asked for its log-probs that returned none (a text hook's) gets them from that forward.
        missing = cfg.actor_rollout_ref.rollout.calculate_log_probs and "rollout_log_probs" not in batch.batch.keys()
        recompute = cfg.actor_rollout_ref.actor.recompute_old_log_prob or missing
        if recompute:  # else the update's own forward gives them, the gap and IS weights (config/old_log_prob.py)
            with timed(timings, "old_log_prob"):
                batch = _merge(batch, c.actor_rollout.compute_log_prob(batch), metrics)
        if cfg.algorithm.rollout_is and "rollout_log_probs" in batch.batch.keys():
            if not recompute:  # the update computes them from its forward
                batch.meta_info[ROLLOUT_IS_KEY] = cfg.algorithm.rollout_is_config()
            else:
                weights, is_metrics = compute_rollout_is_weights(
                    batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], batch.batch["response_mask"],
                    cfg.algorithm.rollout_is_config(),
                )
                batch.batch["rollout_is_weights"] = weights
                metrics.update({k: float(v) for k, v in is_metrics.items()})  # keys are rollout_is/*
        if c.teacher is not None:  # distillation.enable: the teacher's top-k log-probs on these samples
            with timed(timings, "teacher"):
                batch = _merge(batch, c.teacher.compute_teacher_topk(batch), metrics)
        if c.needs_reference:
            with timed(timings, "ref"):
                batch = _merge(batch, c.actor_rollout.compute_ref_log_prob(batch), metrics)
        if c.critic is not None:
            with timed(timings, "values"):
                batch = _merge(batch, c.critic.compute_values(batch), metrics)
        with timed(timings, "adv"):
            batch = self._compute_advantages(batch, metrics)
        if c.critic is not None:
            with timed(timings, "update_critic"):
                metrics.update(mean_metrics(c.critic.update_critic(batch)))
        if ctx.global_step >= cfg.trainer.critic_warmup:
            with timed(timings, "update_actor"):
                if cfg.distillation.enable:
                    batch.meta_info["distillation"] = cfg.distillation
                    metrics.update(mean_metrics(c.actor_rollout.update_actor_distill(batch)))
                else:
                    metrics.update(mean_metrics(c.actor_rollout.update_actor(batch)))
            if self._prefetcher is not None and not cfg.async_training.partial_rollout:
                timings["gen_drain"] = self._prefetcher.drain()  # samples never mix two weight versions
            with timed(timings, "sync_weights"):
                metrics.update(mean_metrics(c.rollout.sync_weights()))
        return batch

    def _mfu_metrics(self, batch: DataProto, timings: dict[str, float]) -> dict[str, float]:
        c, cfg = self._c, self.config
        peak = resolve_peak_tflops(cfg.trainer.peak_tflops_per_device, resolve_device(cfg.trainer.device))
        actor = (c.actor_shape, cfg.actor_rollout_ref.actor.ppo_epochs) if c.actor_shape is not None else None
        critic = (c.critic_shape, cfg.critic.ppo_epochs) if c.critic_shape is not None else None
        return mfu_metrics(batch, timings, c.world_size, peak, actor, critic)

    def validate(self) -> dict[str, float]:
        """Mean score of the validation set with the validation sampling settings, per data source.

        The score is the training score without the overlong penalty (rule and/or reward model, as
        reward_model.combine says). Samples whose scoring failed are counted in val/reward/errors (and
        val/reward/timeouts); reward_model.error_policy=skip leaves them out of the means, fail stops the run
        when too many of a batch failed. The first trainer.log_val_generations samples are kept in
        `self.last_val_samples` for the generation log.
        """
        c = self._c
        wanted = self.config.trainer.log_val_generations
        scores, sources, kept = [], [], []
        errors = timeouts = 0.0
        skip_failed = self.config.reward_model.error_policy == "skip"
        self.last_val_samples = []
        for prompts in c.val_batches():
            prompts.meta_info.update(GenerationRequest(validate=True).to_meta_info())
            out = c.rollout.generate(prompts)
            scored = self._batch_scorer.score(out)
            sequence_scores = scored.scores.sum(-1)
            errors += scored.metrics.get("reward/errors", 0.0)
            timeouts += scored.metrics.get("reward/timeouts", 0.0)
            failed = scored.failed if scored.failed is not None else torch.zeros(len(out), dtype=torch.bool)
            kept.append(~failed if skip_failed else torch.ones_like(failed))
            scores.append(sequence_scores)
            sources.extend(out.non_tensor_batch["data_source"].tolist())
            if len(self.last_val_samples) < wanted:
                self.last_val_samples += decode_samples(
                    out, sequence_scores, c.tokenizer, wanted - len(self.last_val_samples)
                )
        if not scores:
            return {}
        all_scores = torch.cat(scores).double()
        keep = torch.cat(kept)
        metrics = {
            "val/score/mean": all_scores[keep].mean().item() if keep.any() else float("nan"),
            "val/reward/errors": errors,
            "val/reward/timeouts": timeouts,
        }
        for source in sorted(set(sources)):
            mask = torch.tensor([s == source for s in sources]) & keep
            metrics[f"val-core/{source}/reward/mean"] = all_scores[mask].mean().item() if mask.any() else float("nan")
        return metrics

    def fit(self) -> dict[str, float]:
        """Runs training to `trainer.total_training_steps`; returns the last step's metrics (incl. validation)."""
        cfg = self.config.trainer
        if self.components is None:
            self.init_workers()
        self._resume()
        if self.rollout_data_dir is not None:
            remove_stale_temp_files(self.rollout_data_dir)  # a killed run's half-written dumps
        self.tracking = Tracking(cfg.logger, self.run_dir, cfg.project_name, cfg.experiment_name, self.config_dict())
        generations = ValGenerationLogger(cfg.logger, self.run_dir) if cfg.log_val_generations else None
        total = self._c.total_training_steps
        if self.config.async_training.enable:
            self._prefetcher = RolloutPrefetcher(self._rollout, self._c.train_loader,
                                                 self.config.async_training.staleness, self.global_step, total,
                                                 recovery=self._c.rollout)
        progress = Progress(total=total, start=self.global_step)
        tool_watch = ToolCallWatch(self.config.actor_rollout_ref.rollout.multi_turn)
        self.record = record = RunRecord(first_step=self.global_step, last_step=self.global_step)
        started = time.monotonic()
        last: dict[str, float] = {}
        stops = StopRequests()  # SIGTERM/SIGINT: finish the step, checkpoint, raise TrainingInterrupted
        try:
            with stops:
                if cfg.val_before_train and self.global_step == 0:
                    last = self.validate()
                    record.note_validation(0, last)
                    self.tracking.log(last, step=0)
                    if generations is not None:
                        generations.log(self.last_val_samples, step=0)
                    progress.note(last)
                startup = dict(self._c.startup)  # where the start-up went: logged once, with this run's first step
                while self.global_step < total and stops.requested is None:
                    metrics = self.train_step()
                    self.global_step += 1
                    metrics.update(startup)
                    startup = {}
                    if cfg.test_freq > 0 and (self.global_step % cfg.test_freq == 0 or self.global_step == total):
                        metrics.update(self.validate())
                        if generations is not None:
                            generations.log(self.last_val_samples, step=self.global_step)
                    if cfg.save_freq > 0 and (self.global_step % cfg.save_freq == 0 or self.global_step == total):
                        self._save_checkpoint()
                    tool_watch.observe(metrics, self.global_step)
                    self.tracking.log(metrics, step=self.global_step)
                    progress.update(self.global_step, metrics)
                    record.note_validation(self.global_step, metrics)
                    record.note_memory(metrics)
                    record.last_step = self.global_step
                    last = metrics
                if stops.requested is not None and self.global_step < total:
                    raise TrainingInterrupted(stops.requested, self.global_step, self._checkpoint_on_stop())
        finally:
            if self._prefetcher is not None:
                self._prefetcher.close()
                self._prefetcher = None
            progress.close()
            record.seconds = time.monotonic() - started
            self.tracking.close()
            if generations is not None:
                generations.close()
        return last

    def config_dict(self) -> dict[str, Any]:
        from dataclasses import asdict, is_dataclass

        return asdict(self.config) if is_dataclass(self.config) else {}

    def shutdown(self) -> None:
        if self.components is not None:
            self.components.shutdown()
            self.components = None


def _baseline_groups(batch: DataProto) -> np.ndarray:
    """The group of each row for group baselines (GRPO, RLOO, ...): its prompt's uid, except that a trajectory
    which failed through infrastructure (a tool raised, hung or crashed) is a group of its own, so that its
    meaningless 0 does not move its siblings' baseline (its loss mask is all 0 as well)."""
    groups = batch.non_tensor_batch["uid"]
    failed = infra_failed_rows(batch).numpy()
    if not failed.any():
        return groups
    groups = groups.copy()
    groups[failed] = [f"infra-failure-{row}" for row in np.flatnonzero(failed)]
    return groups


def _merge(batch: DataProto, result: DataProto, metrics: dict[str, float]) -> DataProto:
    """batch ∪ result, with the result's per-worker metrics averaged into `metrics` instead of meta_info."""
    metrics.update(mean_metrics(result.meta_info.pop("metrics", {})))
    return batch.union(result)
