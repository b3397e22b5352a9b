"""rollout.log_probs_from=rescore on CUDA (bf16, CUDA graphs off): the in-process engine samples the same seeded
tokens as with decode-time log-probs, and its rescored log-probs (one prompt-log-prob pass over the finished
samples) are as close to an fp32 HF forward on those tokens as the decode's are; full-length samples
(prompt_length + response_length tokens) are scored, which needs the engine's extra context token."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from verl_like.config.rollout import RolloutConfig  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.backends import EngineBuild, build_rollout_engine  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.logprobs import sampled_token_log_probs  # noqa: E402

PROMPT, RESPONSE, ROWS, N = 24, 40, 8, 4


@torch.no_grad()
def _hf_log_probs(path: str, rollout: DataProto) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    batch = rollout.batch
    logits = model(input_ids=batch["input_ids"].cuda(), attention_mask=batch["attention_mask"].cuda(),
                   position_ids=batch["position_ids"].cuda()).logits.float()
    response_logits = logits[:, PROMPT - 1:PROMPT - 1 + RESPONSE]
    return sampled_token_log_probs(response_logits, batch["responses"].cuda(), SamplingConfig()).cpu()


def test_rescored_log_probs_match_the_decodes_samples_in_bf16(small_bf16_qwen2):
    path, config = small_bf16_qwen2
    rollout = RolloutConfig(dtype="bfloat16", prompt_length=PROMPT, response_length=RESPONSE, max_num_seqs=64,
                            gpu_memory_utilization=0.3, load_format="auto", log_probs_from="rescore")
    assert rollout.engine_max_model_len == PROMPT + RESPONSE + 1
    engine = build_rollout_engine(EngineBuild(path, rollout, config))
    try:
        prompts = DataProto.from_dict(tensors={
            "input_ids": torch.randint(10, 40, (ROWS, PROMPT)),
            "attention_mask": torch.ones(ROWS, PROMPT, dtype=torch.long),
            "position_ids": torch.arange(PROMPT).expand(ROWS, PROMPT).clone(),
        })
        sampling = SamplingConfig(n=N, max_tokens=RESPONSE, ignore_eos=True, seed=3)
        decoded = engine.generate(prompts, sampling)
        rescored = engine.generate(prompts, dataclasses.replace(sampling, log_probs_from="rescore"))
    finally:
        engine.shutdown()
    assert torch.equal(decoded.batch["responses"], rescored.batch["responses"])
    assert int(rescored.batch["response_mask"].sum()) == ROWS * N * RESPONSE  # full-length samples were scored
    reference = _hf_log_probs(path, rescored)
    rescore_gap = float((rescored.batch["rollout_log_probs"] - reference).abs().mean())
    decode_gap = float((decoded.batch["rollout_log_probs"] - reference).abs().mean())
    print(f"mean |log-prob - fp32 HF|: rescored {rescore_gap:.2e}, decoded {decode_gap:.2e}")
    assert rescore_gap <= 2e-2 and decode_gap <= 2e-2
    assert rescore_gap <= 2 * decode_gap + 2e-3
