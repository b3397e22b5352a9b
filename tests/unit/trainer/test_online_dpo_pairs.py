"""The online-DPO step's pairing on the driver: judged by the summed score, rows interleaved, skipped pairs masked."""

from __future__ import annotations

import numpy as np
import torch

from verl_like.protocol import DataProto
from verl_like.trainer.online_dpo_step import judge_pairs, pair_rows


def _scored_batch() -> DataProto:
    scores = torch.zeros(6, 3)
    scores[1, 2] = 1.0  # prompt "a": sample 1 is right
    scores[4, 0] = 0.5  # prompt "b": every sample scores 0.5 (a tie)
    scores[3, 1] = 0.5
    scores[5, 1] = 0.5
    return DataProto.from_dict(
        tensors={"token_level_scores": scores, "response_mask": torch.ones(6, 3, dtype=torch.long),
                 "responses": torch.arange(18).view(6, 3)},
        non_tensors={"uid": np.array(["a", "a", "a", "b", "b", "b"], dtype=object)},
    )


def test_pairs_are_interleaved_and_a_skipped_pair_has_no_response_tokens() -> None:
    batch = _scored_batch()
    pairs = judge_pairs(batch, "skip", seed=0)
    assert pairs.chosen.tolist() == [1, 3] and pairs.rejected.tolist() == [0, 4]
    assert pairs.valid.tolist() == [True, False]
    rows = pair_rows(batch, pairs)
    assert rows.batch["responses"][:, 0].tolist() == [3, 0, 9, 12]
    assert rows.batch["response_mask"].sum(-1).tolist() == [3, 3, 0, 0]
    assert batch.batch["response_mask"].sum() == 18  # the rollout batch keeps its masks


def test_random_tie_breaking_keeps_the_tied_prompt() -> None:
    pairs = judge_pairs(_scored_batch(), "random", seed=0)
    assert pairs.valid.tolist() == [True, True]
    assert int(pairs.chosen[1]) != int(pairs.rejected[1]) and {int(pairs.chosen[1]), int(pairs.rejected[1])} <= {3, 4, 5}
