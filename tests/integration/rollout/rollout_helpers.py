"""Plain helpers of the rollout tests: loading the HF reference model and scoring responses with one forward."""

import torch
from transformers import AutoModelForCausalLM

from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.logprobs import sampled_token_log_probs


def load_hf_model(model_dir) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def forward_log_probs(model: torch.nn.Module, rollout: DataProto, sampling: SamplingConfig) -> torch.Tensor:
    """Processed log-probs of `responses` from one HF forward over prompt+response, 0 where masked.

    (batch*n, response_len)
    """
    batch = rollout.batch
    prompt_len = batch["prompts"].shape[1]
    response_len = batch["responses"].shape[1]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    response_logits = logits[:, prompt_len - 1 : prompt_len - 1 + response_len]
    log_probs = sampled_token_log_probs(response_logits, batch["responses"], sampling)
    return log_probs * batch["response_mask"]


@torch.no_grad()
def trainer_gap(model: torch.nn.Module, rollout: DataProto, temperature: float) -> float:
    """Largest |trainer log-prob - rollout log-prob| over the sampled tokens of `rollout`, the trainer's side
    computed as FSDPEngine does per micro-batch (images included: the batch's pixel_values)."""
    from verl_like.engine.micro_batches import engine_inputs
    from verl_like.engine.model_outputs import micro_batch_outputs

    ours = micro_batch_outputs(model, "causal_lm", engine_inputs(rollout, "causal_lm", "test").batch, False,
                               temperature)["log_probs"]
    mask = rollout.batch["response_mask"].bool()
    assert mask.sum() > 0
    return float((ours - rollout.batch["rollout_log_probs"]).abs()[mask].max())


def image_agent_rollout(generator, dataset, sampling: SamplingConfig, agent: str = "single_turn_agent") -> DataProto:
    """The rollout of `dataset`'s first 2 image rows through the agent loop `agent` on `generator` (a
    TokenGenerator)."""
    from verl_like.config.loader import load_config
    from verl_like.experimental.agent_loop.runner import AgentLoopRunner, agent_config_view

    config = load_config(["+trainer=vlm_tiny", f"actor_rollout_ref.rollout.agent.default_agent_loop={agent}",
                          "data.return_raw_chat=true", f"data.max_response_length={sampling.max_tokens}",
                          "data.max_prompt_length=40"])
    runner = AgentLoopRunner(agent_config_view(config), dataset.tokenizer)
    try:
        return runner.run_sync(dataset.collate([dataset[0], dataset[1]]), sampling, generator,
                               int(dataset.tokenizer.pad_token_id))
    finally:
        generator.close()
