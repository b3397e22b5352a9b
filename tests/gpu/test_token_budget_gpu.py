"""Token budgets sized from free memory on CUDA (engine/token_budget.py): one update (two forward/backward passes
and optimizer steps, so AdamW's moments exist in the second) and one log-prob forward at the sized budgets
allocate less than the free memory they were sized from (torch.cuda.max_memory_allocated).

A small random Qwen2 shape with Qwen's vocabulary (the logits dominate, as in the 0.5B run); a ballast tensor
leaves about FREE_GIB free (5 GiB with the chunked LM head), so the budget falls inside the clamps rather than at
131,072 (on an 80 GiB card the activation share's cap, 8 GiB, may decide instead of free memory at 12 GiB).
"""

from __future__ import annotations

import pytest
import torch

from verl_like.engine.config import EngineConfig, MicroBatching
from verl_like.engine.shared import single_process_env
from verl_like.protocol import DataProto

FREE_GIB = 12
PROMPT, RESPONSE = 128, 512


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    single_process_env()
    config = Qwen2Config(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=4096, dtype="bfloat16")
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("token_budget_gpu") / "qwen2"
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    return str(out)


def _batch(rows: int, vocab: int) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, PROMPT + RESPONSE), generator=generator)
    mask = torch.ones_like(ids)
    return DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(dim=1) - 1,
        "responses": ids[:, PROMPT:], "response_mask": mask[:, PROMPT:],
    })


def _loss(outputs, micro_batch):
    mask = micro_batch.batch["response_mask"].to(outputs["log_probs"].dtype)
    return -(outputs["log_probs"] * mask).sum() / micro_batch.meta_info["global_token_count"], {}


@pytest.mark.parametrize("checkpointing, fused, chunked_head, free_gib", [
    (True, True, "1", 5), (True, True, "0", FREE_GIB), (True, False, "0", FREE_GIB), (False, True, "0", FREE_GIB)])
def test_one_update_and_one_forward_at_the_sized_budgets_fit_the_free_memory(model_dir, monkeypatch, checkpointing,
                                                                              fused, chunked_head, free_gib):
    """With the chunked LM head (the default on CUDA) the logits leave the per-token cost, so less is left free
    for the budget to land inside the clamps."""
    from verl_like.engine.fsdp import FSDPEngine
    from verl_like.engine.token_budget import MAX_BUDGET, MIN_BUDGET, free_device_bytes, size_engine_budgets

    monkeypatch.setenv("VERL_LIKE_CHUNKED_HEAD", chunked_head)

    engine = FSDPEngine(EngineConfig(
        model_path=model_dir, dtype="float32", param_dtype="bfloat16", reduce_dtype="float32",
        gradient_checkpointing=checkpointing, fused_kernels=fused, use_remove_padding=True,
        use_dynamic_bsz=True, max_tokens_per_rank=16384, lr=1e-6,
    ))
    ballast = torch.empty(max(0, free_device_bytes() - free_gib * 2**30), dtype=torch.uint8, device="cuda")
    budgets = size_engine_budgets(["update", "log_prob"], engine, None, PROMPT + RESPONSE, 60.0, "test")
    assert MIN_BUDGET < budgets["update"] < MAX_BUDGET, budgets  # inside the clamps: the estimate decides
    free = free_device_bytes()  # what the budgets were sized from (the engine is onloaded again after sizing)
    engine.set_token_budget(budgets["update"])
    vocab = engine.model.config.vocab_size
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):  # the second pass runs with AdamW's moments allocated
        batch = _batch(budgets["update"] // (PROMPT + RESPONSE), vocab)
        result = engine.forward_backward(batch, _loss)
        assert result.num_micro_batches == 1  # the whole batch in one micro-batch at the budget
        engine.optimizer_step()
    update_peak = torch.cuda.max_memory_allocated() - base
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    rows = budgets["log_prob"] // (PROMPT + RESPONSE)
    engine.forward(_batch(rows, vocab), micro_batching=MicroBatching(rows, budgets["log_prob"]))
    forward_peak = torch.cuda.max_memory_allocated() - base
    print(f"budgets {budgets}; free {free / 2**30:.2f} GiB; update peak {update_peak / 2**30:.2f} GiB, "
          f"forward peak {forward_peak / 2**30:.2f} GiB")
    assert update_peak < free and forward_peak < free
    del ballast, engine
    torch.cuda.empty_cache()
