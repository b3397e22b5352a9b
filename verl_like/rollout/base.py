"""The rollout interface every generation backend implements, and the sampling parameters it takes."""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from verl_like.config.rollout import LOG_PROBS_SOURCES, rescorable
from verl_like.protocol import DataProto


@dataclass(frozen=True)
class SamplingConfig:
    """How one `RolloutEngine.generate` call samples.

    Fields:
        n: samples per prompt; output rows i*n .. i*n+n-1 come from prompt i.
        temperature: logits are divided by it before top-k/top-p (ignored when `do_sample` is False).
        top_p: nucleus sampling mass in (0, 1]; 1 keeps every token.
        top_k: keep the k most likely tokens; None keeps every token.
        max_tokens: the most tokens generated per sample; also the width of `responses` (response_len).
        stop_token_ids: extra token ids that end a sample (kept in the response, like eos).
        seed: makes sampling reproducible for a given batch; None draws fresh randomness.
        ignore_eos: keep generating past the eos token(s) until `max_tokens` or a stop token.
        do_sample: False means greedy decoding (argmax); `rollout_log_probs` are then the plain log-softmax.
        log_probs: return `rollout_log_probs`; an engine that can skip computing them (the in-process vLLM
            engine, our servers) leaves the column out when False, others return it anyway.
        log_probs_from: "decode" (each sampled token's log-prob as it is decoded) or "rescore" (none while
            decoding; the finished samples scored in one prompt-log-prob pass of the same engine, which needs
            sampling whose processed log-probs are the plain log-softmax: config/rollout.py:rescorable). Engines
            that cannot rescore (image prompts, agent loops, the HF engine) decode.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 32
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    do_sample: bool = True
    log_probs: bool = True
    log_probs_from: str = "decode"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingConfig.n={self.n} must be >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingConfig.max_tokens={self.max_tokens} must be >= 1")
        if self.do_sample and not self.temperature > 0:
            raise ValueError(
                f"SamplingConfig.temperature={self.temperature} must be > 0 when sampling; "
                "set do_sample=False for greedy decoding"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p={self.top_p} must be in (0, 1]")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"SamplingConfig.top_k={self.top_k} must be >= 1, or None to keep every token")
        if self.log_probs_from not in LOG_PROBS_SOURCES:
            raise ValueError(f"SamplingConfig.log_probs_from={self.log_probs_from!r} is not one of {LOG_PROBS_SOURCES}")
        if self.rescore and not rescorable(self.temperature, self.top_p, self.top_k, self.do_sample):
            raise ValueError(f"SamplingConfig.log_probs_from='rescore' needs temperature 1 (or greedy) without "
                             f"top-k/top-p; got temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"SamplingConfig.stop_token_ids={self.stop_token_ids} must be a tuple of token ids")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def rescore(self) -> bool:
        """True when the rollout's log-probs are asked for and come from a rescoring pass after the decode."""
        return self.log_probs and self.log_probs_from == "rescore"

    @property
    def log_probs_request(self) -> str:
        """What a server's generation route is asked for (rollout/server_generate.py): "decode", "rescore" or
        "none"."""
        return self.log_probs_from if self.log_probs else "none"

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (no temperature/top-k/top-p)."""
        return not self.do_sample

    @property
    def log_prob_temperature(self) -> float:
        """The temperature of the rollout's log-probs, which old and reference log-probs must use: 1 when greedy."""
        return self.temperature if self.do_sample else 1.0

    def vllm_fields(self, prompt_index: int) -> dict[str, Any]:
        """vLLM SamplingParams fields for prompt `prompt_index` of a call, the same in-process and through servers:
        greedy when not do_sample (temperature 0, no top-p/top-k; 0 disables top-k in every supported release),
        and prompt i samples with seed + i * n when the call is seeded."""
        fields: dict[str, Any] = {
            "n": self.n,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature if self.do_sample else 0.0,
            "top_p": self.top_p if self.do_sample else 1.0,
            "top_k": (self.top_k or 0) if self.do_sample else 0,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": list(self.stop_token_ids),
        }
        if self.seed is not None:
            fields["seed"] = self.seed + prompt_index * self.n
        return fields


class RolloutEngine(abc.ABC):
    """Generates responses for token-id prompts and reports the sampled tokens' log-probs.

    Batch layout (verl's): the input has `input_ids`, `attention_mask`, `position_ids`, each (batch, prompt_len),
    left-padded. The output has batch*n rows, interleaved (rows i*n .. i*n+n-1 from prompt i; other columns
    repeated the same way) and holds `prompts` (batch*n, prompt_len), `responses` (batch*n, response_len)
    right-padded with the pad id, `response_mask` (1 for generated tokens incl. the final eos/stop token),
    `input_ids` = cat(prompts, responses), `attention_mask`, `position_ids` (continuing after the prompt) and
    `rollout_log_probs` (batch*n, response_len): log-prob of each sampled token after temperature/top-k/top-p
    processing, 0 where `response_mask` is 0. meta_info["metrics"] carries this call's token counts
    (rollout/generated_tokens, rollout/mean_response_length); the rate of the whole rollout is the caller's.
    """

    @abc.abstractmethod
    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Returns the rollout batch for `prompts` (layout in the class docstring)."""

    @abc.abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads full (unsharded) tensors under their HF names; consumed as a stream, one tensor at a time."""

    @abc.abstractmethod
    def sleep(self) -> None:
        """Frees what the engine can give back between rollouts (KV cache, and weights where configured)."""

    @abc.abstractmethod
    def wake_up(self, tags: list[str] | None = None) -> None:
        """Reverses `sleep`; `tags` (e.g. ["weights"], then ["kv_cache"]) wakes it in stages. The engine owns its
        sleep state: waking a part that is awake does nothing (callers wake before every use)."""

    @abc.abstractmethod
    def reset_cache(self) -> None:
        """Drops cached state computed with older weights (e.g. the prefix cache)."""

    @property
    @abc.abstractmethod
    def tp_rank(self) -> int:
        """This process's rank within the engine's tensor-parallel group."""

    @property
    @abc.abstractmethod
    def tp_size(self) -> int:
        """Number of processes the engine's tensor-parallel group spans."""

    @property
    def supports_slice_loading(self) -> bool:
        """True when the engine takes already-sliced TP pieces straight into its parameters (`slice_loader`), which
        the colocated sliced transport needs; other engines get full tensors through `load_weights`."""
        return False

    def slice_loader(self, params: Any, shape: Any) -> Any:
        """A context manager whose value receives TP slices (resharding/transfer.py's sink protocol)."""
        raise NotImplementedError(f"{type(self).__name__} loads full tensors only (supports_slice_loading is False)")

    def token_generator(self, max_model_len: int) -> Any:
        """The engine's token-level generate for agent loops (`rollout/token_generate.py`: async, one request at a
        time); engines without one cannot run agent loops."""
        raise NotImplementedError(
            f"{type(self).__name__} has no token-level generate; agent loops need one (implement token_generator)")

    @property
    def weight_dtype(self) -> torch.dtype | None:
        """The dtype of the engine's weights (what a transport sends), or None when it takes any."""
        return None

    # ----- adapters and scoring (rollout/vllm_lora.py, rollout/sync_check.py); engines without them keep these -----

    @property
    def supports_adapters(self) -> bool:
        """True when the engine serves base weights plus a LoRA adapter loaded with `load_adapter`."""
        return False

    def load_adapter(self, tensors: dict[str, torch.Tensor], adapter_config: dict[str, Any], version: int) -> None:
        """Serves the adapter `tensors` (PEFT saved names; the engine may modify them) of trainer `version` from
        now on, under a name never used before."""
        raise NotImplementedError(f"{type(self).__name__} serves no LoRA adapters")

    @property
    def supports_scoring(self) -> bool:
        """True when `score_log_probs` works (the sync check needs it)."""
        return False

    def score_log_probs(self, token_ids: list[int], start: int) -> list[float]:
        """Log-probs (temperature 1) the engine's current policy (adapter included) gives tokens start.. of one
        sequence, each given the tokens before it."""
        raise NotImplementedError(f"{type(self).__name__} does not score sequences")

    @property
    def sleep_discards_weights(self) -> bool:
        """True when `sleep` throws the weights away (vLLM's sleep level 2): the owner must load them again
        before the next generation, even if the policy has not changed."""
        return False
