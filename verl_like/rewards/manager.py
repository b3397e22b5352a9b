"""RewardManager: decodes a rollout batch's responses, scores them, and returns token-level scores and metrics.

The score of each response sits on its last valid token (outcome reward), so `token_level_scores` is zero
elsewhere. Scoring runs in a pool of worker processes with a per-sample timeout (verl_like/rewards/pool.py): a
scorer that raises, returns a non-number or hangs gives that sample 0, counted in `reward/errors` and
`reward/timeouts`; whether the run goes on is `error_policy`'s call (verl_like/rewards/error_policy.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from verl_like.protocol import DataProto
from verl_like.rewards.custom import check_reward_signature
from verl_like.rewards.error_policy import ERROR_POLICIES, FailedSample, check_error_budget, describe_failures
from verl_like.rewards.pool import ScoreOutcome, ScoringPool, score_one
from verl_like.rewards.registry import default_compute_score
from verl_like.rollout.trajectory import infra_failed_rows

logger = logging.getLogger(__name__)


@dataclass
class RuleScores:
    """Rule scores of a batch: token_level_scores `(batch, response_len)`, reward/* metrics, and the samples whose
    scoring failed (scored 0)."""

    token_level_scores: torch.Tensor
    metrics: dict[str, float]
    failed: list[FailedSample]

    def failed_mask(self) -> torch.Tensor:
        """`(batch,)` bool: True where scoring failed."""
        mask = torch.zeros(self.token_level_scores.shape[0], dtype=torch.bool)
        mask[[f.index for f in self.failed]] = True
        return mask


class RewardManager:
    """Scores rollout batches with `compute_score` (default: the rule scorer registered for each data_source).

    compute_score: `fn(data_source, solution_str, ground_truth, extra_info) -> float` (called with keywords).
    num_workers: scoring processes; 0 scores in this process, where exceptions still give 0 but nothing can stop
        a scorer that hangs (use it for debugging only).
    timeout_s: per-sample limit in the workers.
    reward_fn_key: the non-tensor column naming each row's data source (data.reward_fn_key).
    error_policy / max_error_fraction: reward_model.error_policy ("fail", "zero" or "skip") and the fraction of
        failed samples a batch may have under fail and skip (verl_like/rewards/error_policy.py).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        compute_score: Callable[..., Any] | None = None,
        *,
        num_workers: int = 2,
        timeout_s: float = 30.0,
        reward_fn_key: str = "data_source",
        error_policy: str = "fail",
        max_error_fraction: float = 0.5,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"reward num_workers={num_workers} must be >= 0 (0 scores in the driver process)")
        if error_policy not in ERROR_POLICIES:
            raise ValueError(f"reward_model.error_policy={error_policy!r} must be one of {ERROR_POLICIES}")
        if not 0 <= max_error_fraction <= 1:
            raise ValueError(f"reward_model.max_error_fraction={max_error_fraction} must lie in [0, 1]")
        self.error_policy = error_policy
        self.max_error_fraction = max_error_fraction
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        check_reward_signature(self.compute_score, "the reward function")
        self.reward_fn_key = reward_fn_key
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._pool = ScoringPool(self.compute_score, num_workers, timeout_s) if num_workers > 0 else None

    def _tasks(self, batch: DataProto, lengths: list[int]) -> list[dict[str, Any]]:
        columns = batch.non_tensor_batch
        for key in (self.reward_fn_key, "ground_truth"):
            if key not in columns:
                raise KeyError(
                    f"RewardManager: the batch has no non-tensor column {key!r} (columns: {sorted(columns)}); "
                    "batches from RLDataset.collate carry it, through generate_sequences"
                )
        responses = batch.batch["responses"]
        texts = self.tokenizer.batch_decode(
            [responses[i, :length].tolist() for i, length in enumerate(lengths)], skip_special_tokens=True
        )
        extra = columns.get("extra_info", np.full(len(batch), None, dtype=object))
        return [
            {"data_source": columns[self.reward_fn_key][i], "solution_str": texts[i],
             "ground_truth": columns["ground_truth"][i], "extra_info": extra[i]}
            for i in range(len(batch))
        ]

    def score_tasks(self, tasks: list[dict[str, Any]]) -> list[ScoreOutcome]:
        """Outcomes of reward-function calls given as keyword dicts (in the pool, or here when num_workers=0)."""
        if self._pool is None:
            return [score_one(self.compute_score, task) for task in tasks]
        return self._pool.map(tasks)

    def score(self, batch: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        """`token_level_scores` `(batch, response_len)` and reward metrics for a rollout batch (see score_batch)."""
        result = self.score_batch(batch)
        return result.token_level_scores, result.metrics

    def score_batch(self, batch: DataProto) -> RuleScores:
        """The rule scores of a rollout batch; raises RewardError when error_policy says the run must stop.

        Reads `responses`, `response_mask` `(batch, response_len)` and the response part of `attention_mask`,
        and the non-tensor columns data_source (`reward_fn_key`), ground_truth and, if present, extra_info. The
        text scored is the whole response (in a multi-turn trajectory the tool replies too: every token the
        attention mask covers); the score sits on the last token the loss trains on (the policy's last sampled
        token), or position 0 for a response with none, where the mask makes every estimator ignore it.
        Rows whose agent loop gave its own score (non-tensor "agent_reward") keep it; rows of trajectories that
        failed through infrastructure ("loss_mask_reason") are not scored (0, outside the loss anyway).
        """
        mask = batch.batch["response_mask"]
        width = mask.shape[1]
        # The whole response's tokens (tool replies too); a batch without an attention mask has only sampled ones.
        attended = batch.batch["attention_mask"][:, -width:] if "attention_mask" in batch.batch.keys() else mask
        lengths = attended.sum(-1).tolist()
        tasks = self._tasks(batch, lengths)
        own = batch.non_tensor_batch.get("agent_reward")
        skip = infra_failed_rows(batch).tolist()
        to_score = [i for i in range(len(tasks)) if not skip[i] and (own is None or own[i] is None)]
        scored = dict(zip(to_score, self.score_tasks([tasks[i] for i in to_score])))
        outcomes = [scored.get(i) or ScoreOutcome(float(own[i]) if own is not None and own[i] is not None else 0.0)
                    for i in range(len(tasks))]
        scores = torch.tensor([o.score for o in outcomes], dtype=torch.float32)
        token_level_scores = torch.zeros(mask.shape, dtype=torch.float32)
        columns = torch.arange(width)
        last = torch.where(mask.bool().any(-1), (columns * mask.bool()).argmax(-1), torch.zeros(len(mask), dtype=torch.long))
        token_level_scores[torch.arange(len(outcomes)), last] = scores
        failed = [
            FailedSample(i, str(tasks[i]["data_source"]), o.error, o.timed_out)
            for i, o in enumerate(outcomes)
            if o.error is not None
        ]
        metrics = {
            "reward/score_mean": float(scores.mean()) if len(outcomes) else 0.0,
            "reward/score_max": float(scores.max()) if len(outcomes) else 0.0,
            "reward/score_min": float(scores.min()) if len(outcomes) else 0.0,
            "reward/errors": float(len(failed)),
            "reward/timeouts": float(sum(f.timed_out for f in failed)),
        }
        check_error_budget(failed, len(outcomes), self.error_policy, self.max_error_fraction, self.timeout_s)
        if failed:
            logger.warning(
                "reward: %d of %d samples failed to score (reward_model.error_policy=%s: %s); %s",
                len(failed), len(outcomes), self.error_policy,
                "left out of the update" if self.error_policy == "skip" else "scored 0",
                describe_failures(failed, self.timeout_s),
            )
        return RuleScores(token_level_scores, metrics, failed)

    def close(self) -> None:
        """Stops the scoring processes."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
