"""RewardModelWorker in a real 2-rank worker group (gloo, fp32) against a float64 single-process HF forward.

Two colocated roles share the group: one padded with row micro-batches and parameter offload, one packed
(use_remove_padding) with token-budget micro-batches. Both must give HF's own score of each unpadded sequence,
on the last valid response token.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from verl_like.config.actor import FSDPConfig
from verl_like.config.errors import ConfigError
from verl_like.config.reward import RewardModelConfig, RewardModelModelConfig
from verl_like.config.tokenizer_check import check_same_tokenizer
from verl_like.engine.from_config import reward_model_engine_config
from verl_like.models.tiny import build_tiny_classifier, build_tokenizer
from verl_like.protocol import DataProto
from verl_like.single_controller import ResourcePool, RoleSpec, WorkerError, WorkerGroup
from verl_like.workers.reward_model import RewardModelWorker, place_on_last_token

PROMPT_LEN, RESPONSE_LEN = 5, 4
# (prompt, response) valid lengths; 7 rows do not split over 2 ranks, so the dispatcher pads.
LENGTHS = [(5, 4), (2, 1), (1, 3), (3, 4), (4, 2), (2, 4), (1, 1)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_classifier(tmp_path_factory.mktemp("rm_models") / "tiny_rm"))


def _config(model_dir: str, **kwargs) -> RewardModelConfig:
    model = kwargs.pop("model", {})
    return RewardModelConfig(enable=True, model=RewardModelModelConfig(path=model_dir, **model), **kwargs)


@pytest.fixture(scope="module")
def group(ray_cluster, model_dir):
    pool = ResourcePool.create([2], device="cpu", cpus_per_process=0.5, name="rm_test")
    roles = {
        "padded": RoleSpec(RewardModelWorker, kwargs={"config": _config(
            model_dir, micro_batch_size_per_gpu=2, model={"fsdp_config": FSDPConfig(param_offload=True)})}),
        "packed": RoleSpec(RewardModelWorker, kwargs={"config": _config(
            model_dir, use_dynamic_bsz=True, forward_max_token_len_per_gpu=12, model={"use_remove_padding": True})}),
    }
    group = WorkerGroup(pool, roles, name="rm_two")
    yield group
    group.shutdown()
    pool.remove()


def _batch(vocab_size: int) -> DataProto:
    gen = torch.Generator().manual_seed(5)
    ids = torch.zeros(len(LENGTHS), PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    for row, (prompt, response) in enumerate(LENGTHS):
        ids[row, PROMPT_LEN - prompt : PROMPT_LEN + response] = torch.randint(
            7, vocab_size, (prompt + response,), generator=gen)
    mask = (ids != 0).long()
    return DataProto.from_dict(tensors={
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT_LEN:],
        "response_mask": mask[:, PROMPT_LEN:],
    })


def _reference_scores(model_dir: str, batch: DataProto) -> torch.Tensor:
    """HF's score of each sequence alone (no padding), float64, one process."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float64).eval()
    scores = []
    with torch.no_grad():
        for row in range(len(batch)):
            valid = batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()]
            scores.append(model(input_ids=valid.unsqueeze(0)).logits[0, 0])
    return torch.stack(scores)


def test_call_before_init_model_names_the_fix(group, model_dir):
    vocab = AutoTokenizer.from_pretrained(model_dir).vocab_size
    with pytest.raises(WorkerError, match=r"call init_model\(\)"):
        group.role("padded").compute_rm_score(_batch(vocab))


def test_scores_on_two_ranks_equal_a_single_process_hf_forward(group, model_dir):
    batch = _batch(len(AutoTokenizer.from_pretrained(model_dir)))
    expected = _reference_scores(model_dir, batch)
    assert expected.std() > 1e-3  # distinct sequences get distinct scores: the comparison means something
    mask = batch.batch["response_mask"]
    last = mask.sum(-1) - 1
    for role in ("padded", "packed"):
        group.role(role).init_model()
        rm_scores = group.role(role).compute_rm_score(batch).batch["rm_scores"]
        assert rm_scores.shape == (len(LENGTHS), RESPONSE_LEN)
        on_last = rm_scores[torch.arange(len(LENGTHS)), last]
        torch.testing.assert_close(on_last.double(), expected, atol=2e-5, rtol=0, msg=role)
        elsewhere = rm_scores.clone()
        elsewhere[torch.arange(len(LENGTHS)), last] = 0
        assert torch.count_nonzero(elsewhere) == 0, role


def test_missing_inputs_are_named(group, model_dir):
    group.role("padded").init_model()
    batch = _batch(len(AutoTokenizer.from_pretrained(model_dir))).select(batch_keys=["input_ids", "attention_mask"])
    with pytest.raises(WorkerError, match=r"lacks \['position_ids', 'responses'\]"):
        group.role("padded").compute_rm_score(batch)


def test_place_on_last_token_puts_an_empty_response_at_column_zero():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    placed = place_on_last_token(torch.tensor([2.0, -1.0, 3.0]), mask)
    assert placed.tolist() == [[0.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]


def test_a_reward_model_with_another_tokenizer_is_refused(model_dir, tmp_path):
    policy = build_tokenizer()
    check_same_tokenizer(policy, model_dir)  # the tiny classifier shares the tiny policy's tokenizer
    other = build_tokenizer()
    other.add_tokens(["<tool>"])
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ConfigError, match=r"reward_model\.model\.path=.*tokenizer other than the policy's.*vocabularies"):
        check_same_tokenizer(policy, tmp_path / "other")


def test_engine_config_maps_every_key(model_dir):
    fsdp = FSDPConfig(model_dtype="bf16", param_dtype="bf16", reduce_dtype="fp32", param_offload=True,
                      reshard_after_forward=False)
    config = _config(model_dir, micro_batch_size_per_gpu=3, use_dynamic_bsz=True, forward_max_token_len_per_gpu=99,
                     model={"use_remove_padding": True, "fsdp_config": fsdp})
    engine = reward_model_engine_config(config, seed=7)
    assert (engine.model_path, engine.model_kind, engine.inference_only, engine.seed) == (
        model_dir, "sequence_classifier", True, 7)
    assert (engine.dtype, engine.param_dtype, engine.reduce_dtype) == ("bfloat16", "bfloat16", "float32")
    assert (engine.micro_batch_size_per_rank, engine.use_dynamic_bsz, engine.max_tokens_per_rank) == (3, True, 99)
    assert engine.use_remove_padding and engine.param_offload and not engine.reshard_after_forward
    assert reward_model_engine_config(_config(model_dir)).max_tokens_per_rank is None
    with pytest.raises(ConfigError, match=r"optimizer_offload=true but the reward model is inference-only"):
        RewardModelModelConfig(path=model_dir, fsdp_config=FSDPConfig(optimizer_offload=True))
