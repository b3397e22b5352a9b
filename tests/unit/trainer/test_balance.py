"""trainer.balance_batch: a permutation applied to every column, equal rows per rank, less token imbalance, and
the same advantages (per sample) as without the reorder."""

import numpy as np
import torch

from verl_like.algorithms import AdvantageConfig, AdvantageInputs, compute_advantage
from verl_like.protocol import DataProto
from verl_like.trainer.balance import balance_batch, rank_token_loads

ROWS, PROMPT_LEN, RESPONSE_LEN, N = 16, 4, 8, 4


def _batch() -> DataProto:
    gen = torch.Generator().manual_seed(0)
    # Groups of N samples in rollout order; the long responses all sit in the first half (rank 0's chunk).
    response_lengths = torch.tensor([8, 8, 7, 8, 7, 8, 6, 8, 1, 2, 1, 1, 2, 1, 1, 3])
    mask = torch.zeros(ROWS, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    mask[:, :PROMPT_LEN] = 1
    for row, length in enumerate(response_lengths.tolist()):
        mask[row, PROMPT_LEN : PROMPT_LEN + length] = 1
    scores = torch.zeros(ROWS, RESPONSE_LEN)
    scores[torch.arange(ROWS), response_lengths - 1] = torch.randint(0, 2, (ROWS,), generator=gen).float()
    return DataProto.from_dict(
        tensors={
            "attention_mask": mask,
            "response_mask": mask[:, PROMPT_LEN:],
            "token_level_rewards": scores,
            "row": torch.arange(ROWS),
        },
        non_tensors={"uid": np.array([f"g{row // N}" for row in range(ROWS)], dtype=object),
                     "tag": np.array([f"r{row}" for row in range(ROWS)], dtype=object)},
    )


def test_reorder_is_one_permutation_applied_to_every_column_and_balances_tokens():
    batch = _batch()
    balanced, metrics = balance_batch(batch, num_ranks=2)
    order = balanced.batch["row"]
    assert sorted(order.tolist()) == list(range(ROWS))
    for key in ("attention_mask", "response_mask", "token_level_rewards"):
        assert torch.equal(balanced.batch[key], batch.batch[key][order]), key
    for key in ("uid", "tag"):
        assert balanced.non_tensor_batch[key].tolist() == batch.non_tensor_batch[key][order.numpy()].tolist(), key
    lengths_before = batch.batch["attention_mask"].sum(1)
    loads_before = rank_token_loads(lengths_before, 2)
    loads_after = rank_token_loads(balanced.batch["attention_mask"].sum(1), 2)
    assert loads_before.tolist() == [92, 44]
    assert loads_after.max() - loads_after.min() <= 1 and loads_after.sum() == loads_before.sum()
    assert metrics["balance/imbalance_before"] == 92 / 68
    assert metrics["balance/imbalance_after"] == loads_after.max().item() / 68


def test_grpo_advantages_follow_the_rows_through_the_reorder():
    batch = _batch()
    balanced, _ = balance_batch(batch, num_ranks=4)

    def advantages(data):
        inputs = AdvantageInputs(token_level_rewards=data.batch["token_level_rewards"],
                                 response_mask=data.batch["response_mask"], index=data.non_tensor_batch["uid"])
        return compute_advantage("grpo", inputs, AdvantageConfig())[0]

    order = balanced.batch["row"]
    torch.testing.assert_close(advantages(balanced), advantages(batch)[order], atol=0, rtol=0)


def test_one_rank_or_an_uneven_batch_is_left_as_it_is():
    batch = _batch()
    for ranks, rows in ((1, ROWS), (3, 14)):
        part = batch[:rows]
        same, metrics = balance_batch(part, num_ranks=ranks)
        assert same is part and metrics == {}
