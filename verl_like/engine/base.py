"""TrainEngine: the interface every training backend (FSDP2 now, Megatron later) implements.

Batch convention (the rollout's output): a DataProto whose batch holds
  input_ids, attention_mask, position_ids: (batch, prompt_len + response_len), prompts left-padded, responses
    right-padded;
  responses: (batch, response_len), the last response_len columns of input_ids;
  response_mask (optional): (batch, response_len); defaults to attention_mask[:, -response_len:].
Model outputs, per model kind:
  causal_lm: "log_probs" (batch, response_len): log p(responses[:, t] | tokens before it) from logits divided by
    the temperature (logits at positions prompt_len-1 ... end-1); "entropy" (batch, response_len) of that same
    distribution when asked for. Entries where the response mask is 0 are 0.
  value: "values" (batch, response_len): the value head at the same positions as the log-probs (the state
    before each response token); 0 where the response mask is 0.
  sequence_classifier: "scores" (batch,): the head at each sequence's last valid token. Batches without
    `responses` are fine for this kind.

Loss contract of `forward_backward` (why: data parallelism must give exactly the full-batch gradient):
  The global loss is the loss of the whole mini-batch, over all data-parallel ranks. `loss_fn` returns this
  micro-batch's *share* of it, so that summing the returned losses over micro-batches and ranks gives the global
  loss. The engine sums gradients over micro-batches and over ranks (no averaging anywhere), so the resulting
  gradient is the gradient of the global loss. To normalise, `loss_fn` reads the global counts the engine puts
  in `micro_batch.meta_info`:
    "global_token_count": valid response tokens in the mini-batch over all ranks (all valid tokens for a batch
      without `responses`);
    "global_sequence_count": sequences with at least one valid token in the mini-batch over all ranks.
  A token-mean loss is `(per_token_loss * mask).sum() / global_token_count`; a sequence-mean one divides the
  sum of per-sequence values by `global_sequence_count`.
  The engine counts the rows it is given, unless the batch's meta_info carries LOSS_COUNTS_KEY, the (tokens,
  sequences) of a larger mini-batch those rows were taken from (the PPO update leaves out rows whose loss has no
  gradient, workers/ppo_update.py): then those counts are the global ones.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl_like.engine.config import EngineConfig, MicroBatching
from verl_like.protocol import DataProto

@dataclass(frozen=True)
class WeightHoldings:
    """Which rank of the trainer's world holds which rectangle of every parameter, in HF names and HF (unfused)
    layout; a pure description, the same on every rank (the sliced weight sync plans from it without talking).

    params: (HF name, full shape) of every parameter, in one fixed order.
    boxes: boxes[i][rank] is the `shapes.layout.Box` of params[i] that global rank `rank` holds (its
      `local_weight_shards()[name]` is exactly that rectangle), or None. Several ranks may hold the same box
      (data-parallel replicas); the plan picks one sender.
    """

    params: tuple[tuple[str, tuple[int, ...]], ...]
    boxes: tuple[tuple[Any, ...], ...]


# meta_info key of a forward_backward batch: (tokens, sequences) of the whole mini-batch over all ranks, when the
# rows given are a subset of it (see the loss contract above).
LOSS_COUNTS_KEY = "mini_batch_loss_counts"

LossFn = Callable[[dict[str, torch.Tensor], DataProto], tuple[torch.Tensor, dict[str, float]]]
"""loss_fn(model_outputs, micro_batch) -> (loss share: 0-d tensor, metrics: {name: float}); see the module doc."""


@dataclass
class ForwardBackwardResult:
    """What one `forward_backward` call reports.

    loss: the global loss: the sum of the losses `loss_fn` returned, over micro-batches and ranks (same on
      every rank).
    metrics: per metric name, the values `loss_fn` returned for this rank's micro-batches, in order.
    num_micro_batches: micro-batches this rank ran (the same on every rank).
    """

    loss: float
    metrics: dict[str, list[float]] = field(default_factory=dict)
    num_micro_batches: int = 0


class TrainEngine(abc.ABC):
    """One model trained data-parallel over a process group; every method is called on every rank together."""

    config: EngineConfig

    def set_token_budget(self, max_tokens: int) -> None:
        """Makes `max_tokens` the budget of the engine's own token micro-batches (use_dynamic_bsz): a budget sized
        after the engine was built, from the memory left (engine/token_budget.py); same value on every rank."""
        if not self.config.use_dynamic_bsz or max_tokens < 1:
            raise ValueError(f"set_token_budget({max_tokens}): the engine micro-batches by tokens only with "
                             "use_dynamic_bsz, and a budget must be >= 1")
        self.config = dataclasses.replace(self.config, max_tokens_per_rank=max_tokens)

    @property
    @abc.abstractmethod
    def dp_rank(self) -> int:
        """This process's rank in the data-parallel group."""

    @property
    @abc.abstractmethod
    def dp_size(self) -> int:
        """Number of data-parallel ranks."""

    @property
    @abc.abstractmethod
    def dp_group(self) -> dist.ProcessGroup:
        """The data-parallel process group (for the roles' own collectives, e.g. loss normalisers, metrics)."""

    @property
    @abc.abstractmethod
    def global_step(self) -> int:
        """Optimizer steps taken (restored by `load_checkpoint`)."""

    @abc.abstractmethod
    def forward(self, batch: DataProto, temperature: float = 1.0, calculate_entropy: bool = False,
                micro_batching: MicroBatching | None = None) -> DataProto:
        """Model outputs for this rank's rows without gradients (see the module doc for keys and shapes), split as
        `micro_batching` says (None: as the engine's config says, its training micro-batches)."""

    @abc.abstractmethod
    def forward_backward(
        self, batch: DataProto, loss_fn: LossFn, temperature: float = 1.0, calculate_entropy: bool = False
    ) -> ForwardBackwardResult:
        """Accumulates the gradient of the global loss over this rank's micro-batches (see the loss contract)."""

    @abc.abstractmethod
    def optimizer_step(self, lr_scale: float = 1.0) -> float:
        """Clips, steps AdamW and the LR scheduler, zeroes gradients; returns the pre-clip global grad norm.

        A non-finite norm skips the update (gradients are dropped, the step still counts). `lr_scale` in (0, 1]
        multiplies this step's learning rate only; the schedule (`current_lr`) is unchanged.
        """

    @property
    @abc.abstractmethod
    def current_lr(self) -> float:
        """Learning rate the next optimizer step uses."""

    @property
    def micro_batch_multiple(self) -> int:
        """The engine splits a batch into a multiple of this many micro-batches (Megatron's interleaved pipeline
        schedule: its pipeline size), so each rank needs at least this many rows; 1 elsewhere."""
        return 1

    @property
    def collects_outputs(self) -> bool:
        """Whether this rank returns the results of its data-parallel rank (one rank per DP rank does: with
        model parallelism, the TP/PP peers of a DP rank get the same rows and compute the same results)."""
        return True

    @abc.abstractmethod
    def weight_holdings(self) -> WeightHoldings:
        """Who holds which rectangle of every parameter (HF layout); pure, the same on every rank."""

    @abc.abstractmethod
    def local_weight_shards(self) -> dict[str, torch.Tensor]:
        """HF name -> this rank's rectangle of that parameter (see `weight_holdings`), no communication; only the
        parameters this rank holds."""

    @abc.abstractmethod
    def full_state_iterator(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF parameter name, full tensor) one parameter at a time; a collective, same order on every rank.
        With a LoRA adapter: the policy with the adapter merged in (engine/lora.py)."""

    def static_weight_names(self) -> frozenset[str]:
        """HF names of the parameters training never changes (a frozen vision tower, engine/vision.py): a weight
        sync may send them once. None by default."""
        return frozenset()

    def full_state_iterator_skipping(self, skip: frozenset[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """`full_state_iterator` without the parameters named in `skip` (an engine that can does not gather them);
        a collective, the same `skip` on every rank."""
        return ((name, tensor) for name, tensor in self.full_state_iterator() if name not in skip)

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the forward computes in (None: unknown); the sync check's tolerance reads it."""
        return None

    # ----- LoRA (engine/lora.py); engines without an adapter keep these defaults -----

    @property
    def lora_enabled(self) -> bool:
        """Whether the engine trains a LoRA adapter on frozen base weights."""
        return False

    def base_state_iterator(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) of the frozen base weights, without the adapter; a collective."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """{PEFT saved name: full tensor, a copy} of the adapter; a collective."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    def adapter_config(self) -> dict[str, Any]:
        """The adapter's adapter_config.json (PEFT's layout)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    def adapter_disabled(self) -> Any:
        """A context manager inside which `forward` computes the base model (the adapter off)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    @abc.abstractmethod
    def save_checkpoint(self, directory: str | Path) -> None:
        """Writes model, optimizer, scheduler, RNG and step to `directory` atomically (sharded)."""

    @abc.abstractmethod
    def load_checkpoint(self, directory: str | Path) -> None:
        """Restores exactly what `save_checkpoint` wrote."""

    @abc.abstractmethod
    def export_hf(self, directory: str | Path, tokenizer: Any | None = None) -> None:
        """Writes the full model (and tokenizer, if given) as a HF directory that transformers and vLLM load."""

    @abc.abstractmethod
    def offload(self) -> None:
        """Moves what the config says (parameters, optimizer state) to CPU memory until `onload`."""

    @abc.abstractmethod
    def onload(self) -> None:
        """Brings back what `offload` moved."""
