"""RewardManager: decodes a rollout batch's responses, scores them, and returns token-level scores and metrics.

The score of each response sits on its last valid token (outcome reward), so `token_level_scores` is zero
elsewhere. Scoring runs in a pool of worker processes with a per-sample timeout (verl_like/rewards/pool.py): a
scorer that raises, returns a non-number or hangs gives that sample 0, counted in `reward/errors` and
`reward/timeouts`; a batch is never lost to a scorer bug.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from verl_like.protocol import DataProto
from verl_like.rewards.custom import check_reward_signature
from verl_like.rewards.pool import ScoreOutcome, ScoringPool, score_one
from verl_like.rewards.registry import default_compute_score

logger = logging.getLogger(__name__)


class RewardManager:
    """Scores rollout batches with `compute_score` (default: the rule scorer registered for each data_source).

    compute_score: `fn(data_source, solution_str, ground_truth, extra_info) -> float` (called with keywords).
    num_workers: scoring processes; 0 scores in this process, where exceptions still give 0 but nothing can stop
        a scorer that hangs (use it for debugging only).
    timeout_s: per-sample limit in the workers.
    reward_fn_key: the non-tensor column naming each row's data source (data.reward_fn_key).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        compute_score: Callable[..., Any] | None = None,
        *,
        num_workers: int = 2,
        timeout_s: float = 30.0,
        reward_fn_key: str = "data_source",
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"reward num_workers={num_workers} must be >= 0 (0 scores in the driver process)")
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
        """`token_level_scores` `(batch, response_len)` and reward metrics for a rollout batch.

        Reads `responses` and `response_mask` `(batch, response_len)` and the non-tensor columns data_source
        (`reward_fn_key`), ground_truth and, if present, extra_info. A response with no valid token gets its
        score at position 0, where the mask makes every estimator ignore it.
        """
        mask = batch.batch["response_mask"]
        lengths = mask.sum(-1).tolist()
        outcomes = self.score_tasks(self._tasks(batch, lengths))
        scores = torch.tensor([o.score for o in outcomes], dtype=torch.float32)
        token_level_scores = torch.zeros(mask.shape, dtype=torch.float32)
        last = torch.tensor([max(length - 1, 0) for length in lengths], dtype=torch.long)
        token_level_scores[torch.arange(len(outcomes)), last] = scores
        errors = [o for o in outcomes if o.error is not None]
        if errors:
            logger.warning("reward: %d of %d samples scored 0 after an error; first: %s",
                           len(errors), len(outcomes), errors[0].error)
        metrics = {
            "reward/score_mean": float(scores.mean()) if len(outcomes) else 0.0,
            "reward/score_max": float(scores.max()) if len(outcomes) else 0.0,
            "reward/score_min": float(scores.min()) if len(outcomes) else 0.0,
            "reward/errors": float(len(errors)),
            "reward/timeouts": float(sum(o.timed_out for o in outcomes)),
        }
        return token_level_scores, metrics

    def close(self) -> None:
        """Stops the scoring processes."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
