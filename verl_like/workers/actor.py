"""PPOActor: the policy's log-probs and its PPO update, on top of a TrainEngine (a plain class, not a Worker).

The worker that hosts it (ActorRolloutWorker) owns the engine's life cycle (offload/onload, checkpoints, weight
sync to the rollout engine); this class only computes. Every method is called on every data-parallel rank
together, each with its own rows.

    engine = build_engine(actor_engine_config(actor_config, model_path, total_training_steps=steps),
                          actor_config.strategy, actor_config.megatron)
    actor = PPOActor(engine, actor_config, rollout_n=rollout_config.n)
    old = actor.compute_log_prob(batch, temperature=rollout_temperature)   # "old_log_probs"
    metrics = actor.update_policy(batch.union(old).union(advantages...))  # {"actor/pg_loss": ..., ...}
"""

from __future__ import annotations

import logging

import torch

from verl_like.algorithms import (
    ADVANTAGE_WEIGHTED_LOSSES,
    LossNormalizer,
    PolicyLossInputs,
    RolloutISConfig,
    aggregate_loss,
    compute_kl_loss,
    compute_policy_loss,
    compute_rollout_is_weights,
    masked_mean,
)
from verl_like.config.actor import ActorConfig
from verl_like.engine.base import LossFn, TrainEngine
from verl_like.engine.config import MicroBatching
from verl_like.engine.model_outputs import response_mask_of
from verl_like.engine.vision import VISION_TENSOR_KEYS, rows_with_images
from verl_like.protocol import DataProto
from verl_like.workers.ppo_update import max_entry, mean_metrics, metric_entries, run_ppo_update
from verl_like.workers.train_request import ROLLOUT_IS_KEY, TrainRequest

logger = logging.getLogger(__name__)

_MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
# Policy-loss metrics that are not token means and so are not reduced like them.
_NOT_TOKEN_MEANS = ("pg_loss", "is_weight_max", "is_weight_min")
# The rollout-vs-trainer gaps the update reports when its own forward gives the old log-probs (compute_log_prob's
# rollout/<name>_mean and _max otherwise), over every response token and over the rows with an image.
_GAPS = ("logprob_diff", "image_logprob_diff")


class PPOActor:
    """The policy role: `compute_log_prob` and `update_policy` with the engine it is given.

    engine: a causal-LM TrainEngine built from `engine/from_config.actor_engine_config(config, ...)` (with an
      optimizer).
    config: the frozen `actor_rollout_ref.actor` node.
    rollout_n: samples per prompt (`actor_rollout_ref.rollout.n`): a mini-batch is config.ppo_mini_batch_size
      prompts, i.e. ppo_mini_batch_size * rollout_n samples over all ranks.
    """

    def __init__(self, engine: TrainEngine, config: ActorConfig, rollout_n: int) -> None:
        config.mini_batch_size_per_rank(1, rollout_n)  # rejects rollout_n < 1 now rather than at the first update
        self.engine = engine
        self.config = config
        self.rollout_n = rollout_n
        self._policy_loss_config = config.policy_loss_config()

    def compute_log_prob(self, batch: DataProto, temperature: float, calculate_entropy: bool = False,
                         micro_batching: MicroBatching | None = None) -> DataProto:
        """"old_log_probs" (and "entropy") `(batch, response_len)` of this rank's rows under the current weights.

        `temperature` must be the rollout's: log-probs come from logits / temperature, as the rollout sampled.
        `micro_batching`: how the forward splits the rows (the worker's rollout.log_prob_* keys); None: the
        engine's training micro-batches.
        """
        outputs = self.engine.forward(batch, temperature=temperature, calculate_entropy=calculate_entropy,
                                      micro_batching=micro_batching)
        return outputs.rename("log_probs", "old_log_probs")

    def update_policy(self, batch: DataProto, request: TrainRequest | None = None) -> dict[str, float]:
        """Runs ppo_epochs over shuffled mini-batches of this rank's rows; returns metrics averaged over the steps.

        The batch needs the model inputs, "old_log_probs" (unless config.recompute_old_log_prob is false: then,
        where absent, the update's forward gives them, detached, and with "rollout_log_probs" in the batch it
        reports rollout/logprob_diff_{mean,max} as compute_log_prob does), "advantages", "ref_log_probs" when
        use_kl_loss is on, optionally "response_mask" and "rollout_is_weights" (from `compute_rollout_is_weights` on
        the driver, multiplying the per-token policy loss; computed here from the forward when the batch has no
        old log-probs and meta_info carries "rollout_is"). `request` (workers/train_request.py; None: the batch's
        meta_info) gives the rollout's temperature and the lr_scale (multiplies the learning rate of this update's
        steps; the asynchronous driver's staleness scaling).
        Metrics: actor/pg_loss, actor/pg_clipfrac(_ratio_high, _ratio_low), actor/pg_clipfrac_lower (verl's:
        dual-clip active), actor/ppo_kl, actor/entropy (only
        when entropy_coeff != 0, the entropy the bonus used), actor/kl_loss and actor/kl_coef (with use_kl_loss),
        actor/is_weight_mean (with rollout IS weights), actor/grad_norm, actor/lr, actor/skipped_row_frac (rows
        left out as `zero_advantage_rows_add_nothing` allows; the token means above then cover the rows trained).
        Every value is the mean over the update's optimizer steps of a mini-batch-wide value (the same on every
        rank).
        """
        rows = self.training_rows(batch)
        request = request or TrainRequest.from_meta_info(batch.meta_info)
        if request.temperature is None:
            raise KeyError(
                "PPOActor.update_policy: batch.meta_info['temperature'] is unset; set it to the rollout's sampling "
                "temperature (the log-probs must be computed as the rollout sampled)"
            )
        rollout_is = batch.meta_info.get(ROLLOUT_IS_KEY)
        history = run_ppo_update(
            self.engine,
            rows,
            self.config,
            lambda normalizer: self.make_loss_fn(normalizer, rollout_is),
            rollout_n=self.rollout_n,
            loss_scale_factor=self.config.loss_scale_factor,
            temperature=request.temperature,
            calculate_entropy=self.config.entropy_coeff != 0,
            lr_scale=request.lr_scale,
            trains=rows_with_advantage if self.zero_advantage_rows_add_nothing() else None,
        )
        metrics = rollout_gap_metrics(mean_metrics(history, "actor"))
        if self.config.use_kl_loss:
            metrics["actor/kl_coef"] = self.config.kl_loss_coef
        return metrics

    def zero_advantage_rows_add_nothing(self) -> bool:
        """Whether the update leaves out rows whose advantage is 0 on every response token: with
        config.skip_zero_advantage_rows on, a built-in policy loss that weights each token by its advantage
        (ADVANTAGE_WEIGHTED_LOSSES), no entropy bonus and no KL loss, such a row's loss is 0 whatever the weights,
        so its forward and backward would only add zeros to the gradient (GRPO's groups whose samples all got the
        same reward). The loss still divides by the whole mini-batch's tokens and sequences."""
        config = self.config
        return (config.skip_zero_advantage_rows and config.policy_loss.loss_mode in ADVANTAGE_WEIGHTED_LOSSES
                and config.entropy_coeff == 0 and not config.use_kl_loss)

    def training_rows(self, batch: DataProto) -> DataProto:
        """The batch's rows narrowed to the tensors the PPO update reads, after checking that they are all there."""
        needed = list(_MODEL_KEYS) + ["advantages"]
        if self.config.recompute_old_log_prob is not False:
            needed.append("old_log_probs")
        if self.config.use_kl_loss:
            needed.append("ref_log_probs")
        missing = [key for key in needed if key not in batch.batch.keys()]
        if missing:
            hint = " (use_kl_loss needs the reference policy's log-probs)" if "ref_log_probs" in missing else ""
            raise KeyError(
                f"PPOActor.update_policy: the batch lacks {missing}{hint}; it has {sorted(batch.batch.keys())}"
            )
        optional = [key for key in ("response_mask", "rollout_is_weights", *VISION_TENSOR_KEYS)
                    if key in batch.batch.keys()]
        if self.config.recompute_old_log_prob is False:
            optional += [key for key in ("old_log_probs", "rollout_log_probs") if key in batch.batch.keys()]
        return batch.select(batch_keys=needed + optional, non_tensor_keys=[], meta_keys=[])

    def make_loss_fn(self, normalizer: LossNormalizer, rollout_is: RolloutISConfig | None = None) -> LossFn:
        """The PPO loss function of one mini-batch (policy loss, entropy bonus, KL loss); other objectives that
        run in the same loop add their terms to it (workers/distill_update.py). `rollout_is`: where the batch has
        no old log-probs (the update's forward gives them), the rollout IS weights are computed from that forward
        with this config (the driver's `compute_rollout_is_weights` otherwise)."""
        config = self.config

        def loss_fn(outputs: dict[str, torch.Tensor], micro_batch: DataProto) -> tuple[torch.Tensor, dict]:
            tensors = micro_batch.batch
            mask = response_mask_of(tensors)
            log_probs = outputs["log_probs"]
            old_log_probs = tensors.get("old_log_probs", None)
            is_weights = tensors.get("rollout_is_weights", None)
            gap_shares, gap_peaks, is_means = {}, {}, {}
            if old_log_probs is None:  # one optimizer step over the batch: the weights that are about to update
                old_log_probs = log_probs.detach()
                if "rollout_log_probs" in tensors.keys():
                    gap_shares, gap_peaks = rollout_gaps(old_log_probs, tensors, mask)
                    if rollout_is is not None:
                        is_weights, is_means, is_peaks = _rollout_is(old_log_probs, tensors, mask, rollout_is)
                        gap_peaks.update(is_peaks)
            policy = compute_policy_loss(
                config.policy_loss.loss_mode,
                PolicyLossInputs(
                    old_log_probs=old_log_probs,
                    log_probs=log_probs,
                    advantages=tensors["advantages"],
                    response_mask=mask,
                    rollout_is_weights=is_weights,
                ),
                normalizer=normalizer,
                config=self._policy_loss_config,
            )
            loss = policy.loss
            shares = {"pg_loss": policy.metrics["pg_loss"]}
            token_means = {name: value for name, value in policy.metrics.items() if name not in _NOT_TOKEN_MEANS}
            token_means["ppo_kl"] = token_means.pop("approx_kl")
            if config.entropy_coeff != 0:
                entropy = outputs["entropy"]
                loss = loss - config.entropy_coeff * aggregate_loss(entropy, mask, normalizer)
                token_means["entropy"] = masked_mean(entropy, mask.bool())
            if config.use_kl_loss:
                kl = compute_kl_loss(
                    log_probs, tensors["ref_log_probs"], mask, normalizer=normalizer, kl_loss_type=config.kl_loss_type
                )
                loss = loss + config.kl_loss_coef * kl.loss
                shares["kl_loss"] = kl.metrics["kl_loss"]
            entries = metric_entries({**shares, **gap_shares}, {**token_means, **is_means}, mask)
            return loss, {**entries, **gap_peaks}

        return loss_fn


def rows_with_advantage(rows: DataProto) -> torch.Tensor:
    """(rows,) bool: the rows with a nonzero (or NaN) advantage on some valid response token."""
    tensors = rows.batch
    return ((tensors["advantages"] != 0) & response_mask_of(tensors).bool()).any(dim=-1)


def rollout_gaps(log_probs: torch.Tensor, tensors, mask: torch.Tensor) -> tuple[dict, dict]:
    """A micro-batch's |rollout_log_probs - log_probs| on response tokens, per gap of `_GAPS`: its sum and token
    count (loss shares: summed over micro-batches and ranks) and its maximum (a `max_entry`)."""
    diff = (tensors["rollout_log_probs"].float() - log_probs.float()).abs()
    scopes = {"logprob_diff": mask.bool()}
    has_image = rows_with_images(tensors)
    if has_image is not None:
        scopes["image_logprob_diff"] = scopes["logprob_diff"] & has_image.to(mask.device).unsqueeze(1)
    shares, peaks = {}, {}
    for name, where in scopes.items():
        values = diff[where]
        shares[f"{name}_sum"] = values.sum().double()
        shares[f"{name}_count"] = torch.tensor(float(values.numel()), dtype=torch.float64)
        peaks.update(max_entry(f"{name}_max", values.max() if values.numel() else diff.new_zeros(())))
    return shares, peaks


def _rollout_is(log_probs: torch.Tensor, tensors, mask: torch.Tensor,
                config: RolloutISConfig) -> tuple[torch.Tensor, dict, dict]:
    """A micro-batch's rollout IS weights from `log_probs` (the old ones), their token-mean metrics and their
    extremes as `max_entry`s (the minimum negated), named like the driver's rollout_is/* metrics."""
    weights, metrics = compute_rollout_is_weights(log_probs, tensors["rollout_log_probs"], mask, config)
    valid = weights[mask.bool()]
    none = valid.new_tensor(float("-inf"))
    peaks = {**max_entry("rollout_is/max", valid.max() if valid.numel() else none),
             **max_entry("rollout_is/negated_min", -valid.min() if valid.numel() else none)}
    means = {name: metrics[name] for name in ("rollout_is/mean", "rollout_is/clipped_frac", "rollout_is/mismatch_kl")}
    return weights, means, peaks


def gap_metrics(values: dict[str, float]) -> dict[str, float]:
    """rollout/<gap>_mean and rollout/<gap>_max from the reduced `rollout_gaps` entries (<gap>_sum, _count, _max)."""
    metrics = {}
    for gap in _GAPS:
        if f"{gap}_count" in values:
            count = values[f"{gap}_count"]
            metrics[f"rollout/{gap}_mean"] = values[f"{gap}_sum"] / count if count > 0 else 0.0
            metrics[f"rollout/{gap}_max"] = values[f"{gap}_max"]
    return metrics


def rollout_gap_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` (the update's, under actor/) with its gap entries turned into compute_log_prob's
    rollout/<gap>_mean and rollout/<gap>_max, and its rollout IS metrics named as the driver's (rollout_is/*)."""
    for name in [name for name in metrics if name.startswith("actor/rollout_is/")]:
        value = metrics.pop(name)
        if name.endswith("/negated_min"):
            metrics["rollout_is/min"] = -value if value != float("-inf") else 0.0
        else:
            metrics[name[len("actor/"):]] = value if value != float("-inf") else 0.0
    gap_names = [name for name in metrics if name[len("actor/"):].startswith(_GAPS)]
    metrics.update(gap_metrics({name[len("actor/"):]: metrics.pop(name) for name in gap_names}))
    return metrics
