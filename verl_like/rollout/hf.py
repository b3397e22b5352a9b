"""Rollout through HF `generate`: the reference engine in tests and the fallback for models vLLM lacks."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from verl_like.protocol import DataProto
from verl_like.rollout.base import RolloutEngine, SamplingConfig
from verl_like.rollout.batch import build_rollout_batch, generation_metrics, prompt_token_lists
from verl_like.rollout.logprobs import sampled_token_log_probs

logger = logging.getLogger(__name__)


def _as_id_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


class HFRolloutEngine(RolloutEngine):
    """Generates with `model.generate` on the model's own device, one batch per call.

    `model` is a loaded causal LM (shared with its owner: `load_weights` writes into it) or a folder to load.
    `eos_token_ids` default to the model's generation config; `pad_token_id` to its generation config or config.
    """

    def __init__(
        self,
        model: PreTrainedModel | str | os.PathLike,
        *,
        pad_token_id: int | None = None,
        eos_token_ids: list[int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not isinstance(model, PreTrainedModel):
            model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype or "auto")
        self.model = model
        generation_config = model.generation_config
        self.eos_token_ids = (
            list(eos_token_ids) if eos_token_ids is not None else _as_id_list(generation_config.eos_token_id)
        )
        if pad_token_id is None:
            pad_token_id = generation_config.pad_token_id
            if pad_token_id is None:
                pad_token_id = model.config.pad_token_id
        if pad_token_id is None:
            raise ValueError("the model defines no pad_token_id; pass HFRolloutEngine(..., pad_token_id=...)")
        self.pad_token_id = int(pad_token_id)

    def _generation_config(self, sampling: SamplingConfig) -> GenerationConfig:
        stop_ids = list(sampling.stop_token_ids) + ([] if sampling.ignore_eos else self.eos_token_ids)
        # HF fills every None field from the model's generation config and then its global defaults (top_k=50),
        # so each warper is set explicitly: 0 / 1.0 switch top-k / top-p off, and an empty eos list stops nothing.
        warpers = (
            dict(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p)
            if sampling.do_sample
            else {}
        )
        return GenerationConfig(
            max_new_tokens=sampling.max_tokens,
            do_sample=sampling.do_sample,
            eos_token_id=stop_ids,
            pad_token_id=self.pad_token_id,
            num_return_sequences=1,
            output_logits=True,
            return_dict_in_generate=True,
            **warpers,
        )

    @torch.no_grad()
    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Returns the rollout batch for `prompts` (layout in `RolloutEngine`)."""
        prompt_token_lists(prompts)  # validates the layout before any work
        device = self.model.device
        input_ids = prompts.batch["input_ids"].repeat_interleave(sampling.n, dim=0).to(device)
        attention_mask = prompts.batch["attention_mask"].repeat_interleave(sampling.n, dim=0).to(device)
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=self._generation_config(sampling),
            )
        self.model.train(was_training)

        generated = output.sequences[:, input_ids.shape[1]:].cpu()
        logits = torch.stack(output.logits, dim=1).cpu()  # (rows, generated_len, vocab), unprocessed
        token_log_probs = sampled_token_log_probs(logits, generated, sampling)
        stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else set(self.eos_token_ids))
        responses, log_probs = [], []
        for row in range(generated.shape[0]):
            tokens = generated[row].tolist()
            length = len(tokens)
            for position, token in enumerate(tokens):
                if token in stop_ids:
                    length = position + 1
                    break
            responses.append(tokens[:length])
            log_probs.append(token_log_probs[row, :length].tolist())
        return build_rollout_batch(
            prompts, responses, log_probs, sampling, self.pad_token_id, generation_metrics(responses)
        )

    def token_generator(self, max_model_len: int) -> Any:
        """Agent loops' generate on this engine, one request at a time (the reference)."""
        from verl_like.rollout.token_generate import HFTokenGenerator

        return HFTokenGenerator(self, max_model_len)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies full tensors into the model's parameters/buffers by HF name."""
        targets = dict(self.model.named_parameters())
        targets.update(dict(self.model.named_buffers()))
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                raise KeyError(f"load_weights: the HF model has no parameter named {name!r}")
            if target.shape != tensor.shape:
                raise ValueError(
                    f"load_weights: {name!r} has shape {tuple(target.shape)}, got {tuple(tensor.shape)}"
                )
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))

    def sleep(self) -> None:
        """Nothing to free: HF `generate` allocates its KV cache per call, and the weights may be shared."""
        logger.debug("HFRolloutEngine.sleep: nothing to free")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to restore (see `sleep`)."""
        logger.debug("HFRolloutEngine.wake_up(tags=%s): nothing to restore", tags)

    def reset_cache(self) -> None:
        """Nothing cached across calls."""

    @property
    def tp_rank(self) -> int:
        return 0

    @property
    def tp_size(self) -> int:
        return 1


def build_hf_engine(model_path: str, options: Any) -> HFRolloutEngine:
    """The "hf" entry's builder (config/rollout_backends.py): the policy loaded with `options`
    (rollout/from_config.py:HFEngineOptions) on this process's device."""
    from verl_like.utils.device import get_torch_device

    dtype = "auto" if options.dtype == "auto" else getattr(torch, options.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, config=options.hf_config, dtype=dtype,
                                                 trust_remote_code=options.trust_remote_code)
    return HFRolloutEngine(model.to(get_torch_device()))
