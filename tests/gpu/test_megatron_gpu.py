"""The Megatron engine on one GPU (TP=1, PP=1, NCCL): bf16 compute with float32 master weights against the HF model,
and a train step that moves the weights. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from transformers import AutoModelForCausalLM  # noqa: E402

from verl_like.config.megatron import MegatronConfig  # noqa: E402
from verl_like.engine.config import EngineConfig  # noqa: E402
from verl_like.engine.shared import single_process_env  # noqa: E402
from verl_like.models.tiny import build_tiny_model  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    single_process_env()
    from verl_like.engine.megatron.engine import MegatronEngine

    model_dir = build_tiny_model(tmp_path_factory.mktemp("megatron_gpu") / "tiny")
    config = EngineConfig(model_path=str(model_dir), param_dtype="bfloat16", lr=1e-2, micro_batch_size_per_rank=2)
    return MegatronEngine(config, MegatronConfig()), model_dir


def _batch(vocab: int) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (4, 24), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded prompt
    return DataProto.from_dict(tensors={
        "input_ids": ids * mask, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, 16:], "response_mask": torch.ones(4, 8, dtype=torch.long),
        "advantages": torch.randn(4, 8, generator=generator),
    })


def test_bf16_log_probs_match_hf_and_a_step_moves_the_weights(engine):
    engine, model_dir = engine
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    batch = _batch(hf.config.vocab_size)
    tensors = batch.batch
    with torch.no_grad():
        logits = hf(input_ids=tensors["input_ids"].cuda(), attention_mask=tensors["attention_mask"].cuda(),
                    position_ids=tensors["position_ids"].cuda()).logits.float().cpu()
    expected = torch.log_softmax(logits[:, 15:23], -1).gather(-1, tensors["responses"].unsqueeze(-1)).squeeze(-1)
    got = engine.forward(batch).batch["log_probs"]
    assert float((got - expected).abs().max()) < 0.1  # bf16 compute against the float32 model
    assert float((got - expected).abs().mean()) < 0.02

    before = {name: t.float().clone() for name, t in engine.full_state_iterator()}

    def loss_fn(outputs, micro_batch):
        mask = micro_batch.batch["response_mask"].float()
        per_token = -outputs["log_probs"] * micro_batch.batch["advantages"]
        return (per_token * mask).sum() / micro_batch.meta_info["global_token_count"], {}

    result = engine.forward_backward(batch, loss_fn)
    grad_norm = engine.optimizer_step()
    assert torch.isfinite(torch.tensor(result.loss)) and 0 < grad_norm < float("inf")
    after = dict(engine.full_state_iterator())
    moved = [name for name, tensor in after.items() if not torch.equal(tensor.float(), before[name])]
    assert len(moved) == len(before)
