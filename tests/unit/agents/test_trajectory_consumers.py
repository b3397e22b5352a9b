"""Every consumer of a rollout batch reads the loss mask: on trajectories with tool tokens in the middle, each gives
what it gives on the same samples with those tokens deleted (the independent reference), in float64."""

import numpy as np
import pytest
import torch

from verl_like.algorithms import AdvantageConfig, AdvantageInputs, apply_kl_penalty, apply_overlong_penalty
from verl_like.algorithms import compute_advantage
from verl_like.algorithms.aggregation import LossNormalizer, aggregate_loss
from verl_like.algorithms.kl_control import FixedKLController
from verl_like.models.tiny import build_tokenizer
from verl_like.protocol import DataProto
from verl_like.rewards.manager import RewardManager
from verl_like.rollout.trajectory import LossMaskReason, Trajectory, build_trajectory_batch, infra_failed_rows
from verl_like.trainer.metrics import data_metrics
from verl_like.trainer.ppo_trainer import _baseline_groups
from verl_like.trainer.rollout_dump import rollout_records

R = 24  # response width
TOOL, TEMPLATE = LossMaskReason.TOOL, LossMaskReason.TEMPLATE


def _trajectories() -> list[Trajectory]:
    """Two prompts x n=2: sampled / tool / template / sampled turns of different lengths, one single-turn."""
    rng = np.random.default_rng(0)
    out = []
    for turns in ([(5, 3, 2, 4)], [(7,)], [(3, 4, 1, 6)], [(2, 2, 2, 2), (3, 1, 1, 2)]):
        t = Trajectory(prompt_ids=[7, 8, 9])
        for segment in turns:
            sampled, *rest = segment
            t.add_sampled(rng.integers(10, 40, sampled).tolist(), (-rng.random(sampled)).tolist())
            if rest:
                tool, template, again = rest
                t.add_inserted(rng.integers(10, 40, tool).tolist(), TOOL)
                t.add_inserted(rng.integers(10, 40, template).tolist(), TEMPLATE)
                t.add_sampled(rng.integers(10, 40, again).tolist(), (-rng.random(again)).tolist())
        out.append(t)
    return out


def _prompts() -> DataProto:
    ids = torch.tensor([[0, 7, 8, 9], [0, 7, 8, 9]])
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": (ids > 0).long(), "position_ids": torch.zeros_like(ids)},
        non_tensors={"uid": np.array(["a", "b"], dtype=object), "data_source": np.array(["x", "x"], dtype=object),
                     "ground_truth": np.array(["1", "2"], dtype=object)})


def _compact(batch: DataProto, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows of each `(batch, R)` tensor at the loss-mask positions only, right-aligned into a fresh batch (the
    same samples with every tool/template token deleted), with its own all-valid mask first."""
    mask = batch.batch["response_mask"].bool()
    lengths = mask.sum(-1)
    compact_mask = torch.arange(R).unsqueeze(0) < lengths.unsqueeze(1)
    out = [compact_mask.long()]
    for tensor in tensors:
        packed = torch.zeros_like(tensor)
        packed[compact_mask] = tensor[mask]
        out.append(packed)
    return tuple(out)


@pytest.fixture
def batch() -> DataProto:
    return build_trajectory_batch(_prompts(), _trajectories(), 2, 4, R, 0, {})


def test_ledger_masks_and_reasons(batch):
    mask, reasons = batch.batch["response_mask"], batch.batch["loss_mask_reason"]
    attention = batch.batch["attention_mask"][:, -R:]
    assert torch.equal(mask.bool(), reasons == int(LossMaskReason.TRAINED))
    assert ((reasons == int(TOOL)) | (reasons == int(TEMPLATE))).any(-1).tolist() == [True, False, True, True]
    assert torch.equal(attention.bool(), reasons != int(LossMaskReason.PADDING))  # tool tokens are attended
    assert (batch.batch["rollout_log_probs"][~mask.bool()] == 0).all()
    # position ids run over every attended token, across turns
    full = batch.batch["attention_mask"]
    assert torch.equal(batch.batch["position_ids"], (full.cumsum(-1) - 1).clamp(min=0))


def test_truncated_trajectory_marks_the_rest(batch):
    t = Trajectory([1])
    t.add_sampled(list(range(10, 30)), [-0.1] * 20)
    t.add_inserted([5, 5, 5, 5, 5, 5], TOOL)
    out = build_trajectory_batch(_prompts()[:1], [t], 1, 4, R, 0, {})
    assert t.truncated and int(out.batch["attention_mask"][0, -R:].sum()) == R
    t2 = Trajectory([1])
    t2.add_sampled([10, 11], [-0.1, -0.2])
    t2.truncated = True
    out2 = build_trajectory_batch(_prompts()[:1], [t2], 1, 4, R, 0, {})
    assert (out2.batch["loss_mask_reason"][0, 2:] == int(LossMaskReason.TRUNCATED)).all()


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus"])
def test_outcome_advantages_match_compact(batch, estimator):
    scores = torch.zeros(4, R, dtype=torch.float64)
    mask = batch.batch["response_mask"]
    last = (torch.arange(R) * mask.bool()).argmax(-1)
    scores[torch.arange(4), last] = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    uid = np.array(["a", "a", "b", "b"], dtype=object)
    config = AdvantageConfig(gamma=1.0, lam=1.0)
    adv, _ = compute_advantage(estimator, AdvantageInputs(scores, mask, uid), config)
    c_mask, c_scores = _compact(batch, scores)
    ref, _ = compute_advantage(estimator, AdvantageInputs(c_scores, c_mask, uid), config)
    assert torch.allclose(adv[mask.bool()], ref[c_mask.bool()], atol=1e-12)
    assert (adv[~mask.bool()] == 0).all()


def test_gae_matches_compact(batch):
    g = torch.Generator().manual_seed(1)
    mask = batch.batch["response_mask"]
    rewards = torch.randn(4, R, generator=g, dtype=torch.float64) * mask
    values = torch.randn(4, R, generator=g, dtype=torch.float64)
    uid = np.array(["a", "a", "b", "b"], dtype=object)
    config = AdvantageConfig(gamma=0.9, lam=0.8)
    adv, ret = compute_advantage("gae", AdvantageInputs(rewards, mask, uid, values=values), config)
    c_mask, c_rewards, c_values = _compact(batch, rewards, values)
    ref_adv, ref_ret = compute_advantage("gae", AdvantageInputs(c_rewards, c_mask, uid, values=c_values), config)
    assert torch.allclose(adv[mask.bool()], ref_adv[c_mask.bool()], atol=1e-10)
    assert torch.allclose(ret[mask.bool()], ref_ret[c_mask.bool()], atol=1e-10)


def test_kl_in_reward_and_loss_aggregation_match_compact(batch):
    g = torch.Generator().manual_seed(2)
    mask = batch.batch["response_mask"]
    old = -torch.rand(4, R, generator=g, dtype=torch.float64)
    ref = -torch.rand(4, R, generator=g, dtype=torch.float64)
    scores = torch.zeros(4, R, dtype=torch.float64)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, kl_ctrl=FixedKLController(0.1), kl_penalty="k3")
    c_mask, c_old, c_ref, c_scores = _compact(batch, old, ref, scores)
    c_rewards, c_metrics = apply_kl_penalty(c_scores, c_old, c_ref, c_mask, kl_ctrl=FixedKLController(0.1),
                                            kl_penalty="k3")
    assert metrics["kl"] == pytest.approx(c_metrics["kl"], abs=1e-12)
    assert torch.allclose(rewards[mask.bool()], c_rewards[c_mask.bool()])
    assert (rewards[~mask.bool()] == 0).all()  # no KL charged on tool tokens
    losses = torch.rand(4, R, generator=g, dtype=torch.float64)  # e.g. per-token entropy or policy loss
    (c_losses,) = _compact(batch, losses)[1:]
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        norm = LossNormalizer(mode, float(mask.sum()), 4.0)
        assert float(aggregate_loss(losses, mask, norm)) == pytest.approx(
            float(aggregate_loss(c_losses, c_mask, LossNormalizer(mode, float(c_mask.sum()), 4.0))), abs=1e-12)


def test_overlong_penalty_and_length_metrics_count_sampled_tokens_only(batch):
    mask = batch.batch["response_mask"]
    scores = torch.zeros(4, R, dtype=torch.float64)
    _, penalty = apply_overlong_penalty(scores, mask, max_response_length=R, overlong_buffer_len=8,
                                        penalty_factor=1.0)
    c_mask, c_scores = _compact(batch, scores)
    _, c_penalty = apply_overlong_penalty(c_scores, c_mask, max_response_length=R, overlong_buffer_len=8,
                                          penalty_factor=1.0)
    assert torch.equal(penalty, c_penalty)
    b = batch.batch
    for key in ("token_level_scores", "token_level_rewards", "advantages", "returns"):
        b[key] = torch.zeros(4, R)
    metrics = data_metrics(batch, R)
    assert metrics["response_length/max"] == float(mask.sum(-1).max())  # 12 sampled, not 17 attended
    assert metrics["response_length/max"] < float(b["attention_mask"][:, -R:].sum(-1).max())


def test_reward_manager_scores_whole_trajectory_on_last_sampled_token():
    tok = build_tokenizer()
    t = Trajectory([1])
    t.add_sampled(tok.encode("12", add_special_tokens=False), [-0.1, -0.1])
    t.add_inserted(tok.encode("+3", add_special_tokens=False), TOOL)
    t.add_inserted([tok.eos_token_id], TEMPLATE)
    prompts = _prompts()[:1]
    prompts.non_tensor_batch["ground_truth"] = np.array(["12+3"], dtype=object)
    out = build_trajectory_batch(prompts, [t], 1, 4, R, tok.pad_token_id, {})
    out.non_tensor_batch["data_source"] = np.array(["synthetic/sort"], dtype=object)
    scores = RewardManager(tok, num_workers=0).score_batch(out).token_level_scores
    assert scores[0, 1] == 1.0 and scores.sum() == 1.0  # whole text "12+3" right; placed on the last sampled token


def test_infra_failure_leaves_loss_baseline_and_scoring(batch):
    trajectories = _trajectories()
    trajectories[1].infra_failure = "tool 'calculator' raised RuntimeError: sandbox died"
    failed_batch = build_trajectory_batch(_prompts(), trajectories, 2, 4, R, 0, {})
    assert infra_failed_rows(failed_batch).tolist() == [False, True, False, False]
    assert failed_batch.batch["response_mask"][1].sum() == 0
    assert (failed_batch.batch["loss_mask_reason"][1, :7] == int(LossMaskReason.INFRA_FAILURE)).all()
    failed_batch.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b"], dtype=object)
    groups = _baseline_groups(failed_batch)
    assert groups[0] == "a" and groups[1] != "a"
    calls = []
    manager = RewardManager(build_tokenizer(), lambda **kw: calls.append(kw) or 1.0, num_workers=0)
    scores = manager.score_batch(failed_batch)
    assert len(calls) == 3 and scores.token_level_scores[1].sum() == 0 and scores.metrics["reward/errors"] == 0


def test_rollout_dump_records_whole_trajectory_and_trained_tokens(batch):
    batch.batch["token_level_scores"] = torch.zeros(4, R)
    records = rollout_records(batch, build_tokenizer(), step=1, weight_version=0)
    assert [r["trained_tokens"] for r in records] == batch.batch["response_mask"].sum(-1).tolist()
    assert not any(r["infra_failure"] for r in records)


def test_rollout_dump_records_each_turns_version():
    trajectories = _trajectories()
    trajectories[3].turn_versions = [4, 4, 5, 5]  # partial rollout: a weight update between its turns
    scored = build_trajectory_batch(_prompts(), trajectories, 2, 4, R, 0, {})
    scored.batch["token_level_scores"] = torch.zeros(4, R)
    records = rollout_records(scored, build_tokenizer(), step=1, weight_version=4)
    assert [r["turn_versions"] for r in records] == [[0, 0], [0], [0, 0], [4, 4, 5, 5]]


def test_a_killed_writers_temp_files_are_removed_and_whole_files_kept(tmp_path):
    from verl_like.trainer.rollout_dump import remove_stale_temp_files

    (tmp_path / "3.jsonl").write_text("{}\n")
    (tmp_path / ".4.jsonl.1234.tmp").write_text("{half")
    (tmp_path / ".notes.txt").write_text("mine")
    assert [p.name for p in remove_stale_temp_files(tmp_path)] == [".4.jsonl.1234.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.txt", "3.jsonl"]
    assert remove_stale_temp_files(tmp_path / "absent") == []
