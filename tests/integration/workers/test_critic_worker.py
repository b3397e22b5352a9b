"""CriticWorker in real worker groups (gloo, fp32, tiny Qwen2 backbone with a fresh value head): 2 ranks vs 1.

The 2-rank group offloads between calls (a no-op move on CPU, but the onload/offload bookkeeping runs); the
1-rank group does not. Values, update metrics and the values after the update must agree, and a checkpoint
taken between two updates must reproduce the second update exactly.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from verl_like.config.actor import FSDPConfig, OptimConfig
from verl_like.config.critic import CriticConfig
from verl_like.models.tiny import build_tiny_model
from verl_like.protocol import DataProto
from verl_like.single_controller import ResourcePool, RoleSpec, WorkerError, WorkerGroup
from verl_like.workers.critic import CriticWorker

ROWS, PROMPT_LEN, RESPONSE_LEN = 8, 4, 5
ROLLOUT_N = 2  # mini-batches: 2 prompts x 2 samples = 4 rows, 2 per rank
CONFIG = CriticConfig(
    ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, ppo_epochs=2, cliprange_value=0.05,
    optim=OptimConfig(lr=1e-3, eps=1e-5, weight_decay=0.0),
)
OFFLOADING = CriticConfig(
    ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, ppo_epochs=2, cliprange_value=0.05,
    optim=OptimConfig(lr=1e-3, eps=1e-5, weight_decay=0.0),
    fsdp_config=FSDPConfig(param_offload=True, optimizer_offload=True),
)


def _inputs(vocab_size: int) -> dict[str, torch.Tensor]:
    """Rows of (prompt, response) lengths; prompts left-padded, responses right-padded with id 0."""
    gen = torch.Generator().manual_seed(3)
    lengths = [(4, 5), (2, 1), (1, 3), (3, 5), (4, 2), (2, 4), (1, 1), (3, 3)]
    ids = torch.zeros(ROWS, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    for row, (prompt, response) in enumerate(lengths):
        ids[row, PROMPT_LEN - prompt : PROMPT_LEN + response] = torch.randint(3, vocab_size, (prompt + response,),
                                                                             generator=gen)
    mask = (ids != 0).long()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT_LEN:],
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("critic_models") / "tiny"))


@pytest.fixture(scope="module")
def critics(ray_cluster, model_dir):
    pool = ResourcePool.create([3], device="cpu", cpus_per_process=0.5, name="critic_test")
    two_pool, one_pool = pool.split([2, 1])
    n = {"rollout_n": ROLLOUT_N}
    two = WorkerGroup(two_pool, RoleSpec(CriticWorker, (OFFLOADING, model_dir), n), name="critic_two")
    one = WorkerGroup(one_pool, RoleSpec(CriticWorker, (CONFIG, model_dir), n), name="critic_one")
    yield two, one
    two.shutdown()
    one.shutdown()
    pool.remove()


@pytest.fixture(scope="module")
def inputs(model_dir) -> DataProto:
    return DataProto.from_dict(tensors=_inputs(AutoConfig.from_pretrained(model_dir).vocab_size))


def test_calls_before_init_model_name_the_fix(critics, inputs):
    two, _ = critics
    with pytest.raises(WorkerError, match=r"call init_model\(\)"):
        two.compute_values(inputs)


def test_values_and_update_on_two_ranks_equal_one_process(critics, inputs, tmp_path):
    two, one = critics
    two.init_model()
    one.init_model()
    values_two, values_one = two.compute_values(inputs), one.compute_values(inputs)
    torch.testing.assert_close(values_two.batch["values"], values_one.batch["values"], atol=1e-6, rtol=0)
    values = values_one.batch["values"]
    mask = inputs.batch["attention_mask"][:, PROMPT_LEN:].bool()
    assert torch.all(values[~mask] == 0) and values[mask].abs().min() > 0

    gen = torch.Generator().manual_seed(4)
    batch = inputs.union(values_one)
    batch.batch["returns"] = values + torch.randn(values.shape, generator=gen)
    batch.batch["values"] = values + 0.05 * torch.randn(values.shape, generator=gen)  # the rollout-time values
    metrics_two = two.update_critic(batch).meta_info["metrics"]
    # Mini-batch k is the k-th slice of every rank's rows: rows 0-1 and 4-5, then 2-3 and 6-7.
    metrics_one = one.update_critic(batch[[0, 1, 4, 5, 2, 3, 6, 7]]).meta_info["metrics"]
    assert metrics_two.keys() == metrics_one.keys() == {
        "critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr",
        "perf/critic/cpu_memory_used_gb",  # each process's own, not compared
    }
    for name, (value,) in metrics_one.items():
        if name.startswith("critic/"):
            assert metrics_two[name] == pytest.approx([value, value], rel=1e-5, abs=1e-7), name
    assert 0 < metrics_one["critic/vf_clipfrac"][0] < 1
    after_two, after_one = two.compute_values(inputs), one.compute_values(inputs)
    torch.testing.assert_close(after_two.batch["values"], after_one.batch["values"], atol=2e-6, rtol=0)
    assert (after_one.batch["values"] - values).abs().max() > 1e-3  # the update moved the critic

    # Checkpoint, update again, restore, update again: the two second updates are identical.
    two.save_checkpoint(str(tmp_path / "critic_ckpt"))
    first = two.update_critic(batch).meta_info["metrics"]
    values_first = two.compute_values(inputs).batch["values"]
    two.load_checkpoint(str(tmp_path / "critic_ckpt"))
    second = two.update_critic(batch).meta_info["metrics"]
    critic_keys = [key for key in first if key.startswith("critic/")]
    assert [second[key] for key in critic_keys] == [first[key] for key in critic_keys]
    assert torch.equal(two.compute_values(inputs).batch["values"], values_first)


def test_update_names_missing_keys_and_uneven_mini_batches(critics, inputs):
    two, _ = critics
    two.init_model()
    with pytest.raises(WorkerError, match=r"lacks \['values', 'returns'\]"):
        two.update_critic(inputs)
    values = two.compute_values(inputs)
    rows = inputs.union(values)
    rows.batch["returns"] = values.batch["values"]
    with pytest.raises(WorkerError, match=r"holds 3 samples.*critic\.ppo_mini_batch_size"):
        two.update_critic(rows[:6])
