"""HFRolloutEngine: the reference engine follows the rollout contract on the tiny model."""

import dataclasses

import pytest
import torch

from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.hf import HFRolloutEngine

from rollout_helpers import forward_log_probs, load_hf_model

SAMPLED = SamplingConfig(n=3, temperature=0.7, top_k=8, top_p=0.9, max_tokens=10, seed=11)


@pytest.fixture(scope="module")
def engine(hf_model):
    return HFRolloutEngine(hf_model)


@torch.no_grad()
def greedy_by_hand(model, prompt: list[int], steps: int) -> list[int]:
    """Argmax decoding, one full forward per token, no padding and no KV cache."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_matches_step_by_step_argmax(engine, hf_model, prompt_batch):
    out = engine.generate(prompt_batch, SamplingConfig(do_sample=False, max_tokens=6))
    for row, (ids, mask) in enumerate(zip(prompt_batch.batch["input_ids"], prompt_batch.batch["attention_mask"])):
        prompt = ids[mask.bool()].tolist()
        assert out.batch["responses"][row].tolist() == greedy_by_hand(hf_model, prompt, 6)


@pytest.mark.parametrize(
    "sampling", [SamplingConfig(do_sample=False, max_tokens=8), SAMPLED], ids=["greedy", "sampled"]
)
def test_log_probs_match_a_forward_of_the_sampled_tokens(engine, hf_model, prompt_batch, sampling):
    out = engine.generate(prompt_batch, sampling)
    mask = out.batch["response_mask"].bool()
    expected = forward_log_probs(hf_model, out, sampling)
    got = out.batch["rollout_log_probs"]
    assert torch.isfinite(got).all()
    assert (got[~mask] == 0).all()
    assert (got[mask] < 0).all()
    assert (got - expected).abs().max() < 1e-4


def test_samples_are_interleaved_and_seeded(engine, prompt_batch):
    first = engine.generate(prompt_batch, SAMPLED)
    again = engine.generate(prompt_batch, SAMPLED)
    other = engine.generate(prompt_batch, dataclasses.replace(SAMPLED, seed=12))
    assert len(first) == len(prompt_batch) * 3
    assert list(first.non_tensor_batch["uid"][:6]) == ["p0", "p0", "p0", "p1", "p1", "p1"]
    assert torch.equal(first.batch["prompts"][3], prompt_batch.batch["input_ids"][1])
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert not torch.equal(first.batch["responses"], other.batch["responses"])
    # Three samples of one prompt are not all the same sequence.
    assert not torch.equal(first.batch["responses"][0], first.batch["responses"][1]) or not torch.equal(
        first.batch["responses"][1], first.batch["responses"][2]
    )


def test_eos_and_stop_tokens_end_samples_and_ignore_eos_continues(hf_model, prompt_batch):
    greedy = SamplingConfig(do_sample=False, max_tokens=8)
    free = HFRolloutEngine(hf_model).generate(prompt_batch, greedy).batch["responses"]
    stop = int(free[1, 2])
    first_hit = free[1].tolist().index(stop)

    as_eos = HFRolloutEngine(hf_model, eos_token_ids=[stop])
    for sampling in (greedy, SamplingConfig(do_sample=False, max_tokens=8, stop_token_ids=(stop,))):
        engine = as_eos if not sampling.stop_token_ids else HFRolloutEngine(hf_model)
        out = engine.generate(prompt_batch, sampling)
        assert out.batch["responses"][1, : first_hit + 1].tolist() == free[1, : first_hit + 1].tolist()
        assert out.batch["response_mask"][1].tolist() == [1] * (first_hit + 1) + [0] * (7 - first_hit)
        assert (out.batch["responses"][1, first_hit + 1 :] == engine.pad_token_id).all()
        assert (out.batch["rollout_log_probs"][1, first_hit + 1 :] == 0).all()

    ignored = as_eos.generate(prompt_batch, SamplingConfig(do_sample=False, max_tokens=8, ignore_eos=True))
    assert torch.equal(ignored.batch["responses"], free)
    assert ignored.batch["response_mask"].all()


def test_load_weights_changes_the_policy_and_checks_names(tiny_model_dir, prompt_batch):
    model = load_hf_model(tiny_model_dir)
    engine = HFRolloutEngine(model)
    greedy = SamplingConfig(do_sample=False, max_tokens=6)
    before = engine.generate(prompt_batch, greedy)
    generator = torch.Generator().manual_seed(0)
    new_head = torch.randn(model.lm_head.weight.shape, generator=generator)
    engine.load_weights(iter([("lm_head.weight", new_head)]))
    assert torch.equal(model.lm_head.weight, new_head)
    after = engine.generate(prompt_batch, greedy)
    assert not torch.equal(before.batch["rollout_log_probs"], after.batch["rollout_log_probs"])
    with pytest.raises(KeyError, match="no parameter named 'lm_head.weights'"):
        engine.load_weights([("lm_head.weights", new_head)])
    with pytest.raises(ValueError, match="'model.norm.weight' has shape"):
        engine.load_weights([("model.norm.weight", torch.ones(3))])


def test_engine_loads_from_a_folder_and_reports_tp(tiny_model_dir, prompt_batch):
    engine = HFRolloutEngine(tiny_model_dir)
    assert (engine.tp_rank, engine.tp_size) == (0, 1)
    assert engine.pad_token_id == 0 and engine.eos_token_ids == [2]
    engine.sleep()
    engine.wake_up(["weights"])
    engine.reset_cache()
    out = engine.generate(prompt_batch, SamplingConfig(do_sample=False, max_tokens=3))
    assert out.meta_info["metrics"]["rollout/generated_tokens"] == 3 * len(prompt_batch)
