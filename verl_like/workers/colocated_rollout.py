"""The rollout side of an actor-rollout worker, for each placement: the engine in this process, or the servers.

`ActorRolloutWorker` (actor_rollout.py) is the policy role (actor, reference, the policy version and the weight
sync's one entry point) plus one of these, chosen once in `init_model` from the Topology:
- `ColocatedRolloutComponent`: the in-process engine (or a user's text hook) on this rank's TP group: staged wake
  and sleep, generation (one batched call, agent loops, or the text hook), the engine's side of a weight sync, its
  sync check, the group's token rate;
- `ServerRolloutLink`: the rollout lives in servers; this rank sends them weights (rank 0) and checks them, and
  generation refuses (the driver generates: trainer/rollout_handle.py).
Both answer the same calls, so the worker never asks which placement it is in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from verl_like.config.rollout import RolloutConfig
from verl_like.config.topology import RoleTopology
from verl_like.engine.base import TrainEngine
from verl_like.experimental.agent_loop.engine_rollout import engine_agent_rollout, rows_use_agent_loops
from verl_like.protocol import DataProto
from verl_like.resharding.transports import WeightTransport
from verl_like.rollout.base import RolloutEngine, SamplingConfig
from verl_like.rollout.batch import build_rollout_batch, generation_metrics, prompt_token_lists, rollout_rate
from verl_like.rollout.request import GenerationRequest

logger = logging.getLogger(__name__)


class ColocatedRolloutComponent:
    """This rank's rollout engine in the trainer's process (module doc).

    engine: the RolloutEngine, or None when a user's text hook generates (`text_hook`, prompts -> texts, with the
    worker's `tokenizer`). layout: the rollout's TP groups over the worker group (Topology.rollout). rank: this
    worker's rank.
    """

    def __init__(self, engine: RolloutEngine | None, config: RolloutConfig, layout: RoleTopology, rank: int,
                 tokenizer: Any = None, text_hook: Callable[[list[str]], list[str]] | None = None,
                 owner: str = "ActorRolloutWorker") -> None:
        self.engine = engine
        self.config = config
        self.layout = layout
        self.rank = rank
        self.tokenizer = tokenizer
        self.text_hook = text_hook
        self.owner = owner  # the worker class, in errors
        self.weights_discarded = False  # the engine's last sleep threw its weights away (sleep_discards_weights)
        self.agent_runner: Any = None  # configure_agent_loops: rollouts run through agent loops

    # ----- the weight sync's engine side -----

    def before_sync(self, transport: WeightTransport) -> None:
        """Stage 1 of a wake-up: the weights only (the KV cache comes back for generation); a transport that
        tracked what the engine held forgets it when the engine's sleep discarded it."""
        if self.engine is not None:
            self.engine.wake_up(["weights"])
        if self.weights_discarded:
            transport.forget_engine_weights()

    def after_sync(self) -> None:
        self.weights_discarded = False

    def sync_check(self, engine: TrainEngine, transport: WeightTransport, version: int,
                   vocab_size: Callable[[], int]) -> dict[str, float]:
        """rollout/sync_check.py on this rank's engine: rollout/sync_check_gap, or SyncCheckError naming it."""
        from verl_like.rollout import sync_check

        rollout, config = self.engine, self.config
        if not config.sync_check or rollout is None or not rollout.supports_scoring:
            return {}
        rollout.wake_up(["kv_cache"])  # scoring runs a forward; generation follows the sync and wakes it anyway
        limit = sync_check.tolerance([rollout.weight_dtype, engine.compute_dtype], config.sync_check_tolerance)
        adapter = getattr(rollout, "adapter_name", None)
        label = f"rank {self.rank}'s in-process {type(rollout).__name__}" + (f" (adapter {adapter})" if adapter else "")
        result = sync_check.check_colocated(engine, rollout, limit, label, version, version, vocab_size(),
                                            config.engine_max_model_len)
        return result.metrics()

    # ----- generation -----

    @property
    def reloads_on_wake(self) -> bool:
        """Whether the next wake-up must load the weights again (the engine's sleep discarded them)."""
        return self.weights_discarded

    def wake(self) -> None:
        """Wakes the engine for generation, staged: weights before the KV cache; the engine owns its sleep state and
        skips parts already awake."""
        if self.engine is None:
            return
        self.engine.wake_up(["weights"])
        self.engine.wake_up(["kv_cache"])

    def sleep(self) -> None:
        if self.engine is not None and self.config.free_cache_engine:
            self.engine.sleep()
            self.weights_discarded = self.engine.sleep_discards_weights

    def sampling(self, prompts: DataProto) -> SamplingConfig:
        """The sampling of this TP group's chunk `prompts` (meta_info: a GenerationRequest)."""
        # With a seed, this TP group's prompts take the seeds after those of the (equal) DP chunks before it.
        dp_rank = self.layout.coord(self.rank).dp_rank
        return GenerationRequest.from_meta_info(prompts.meta_info).sampling(
            self.config, prompts_before=dp_rank * len(prompts)
        )

    def generate(self, prompts: DataProto, sampling: SamplingConfig, version: int) -> DataProto:
        """This TP group's rollout of `prompts` at policy `version`; the engine must be awake (`wake`)."""
        if rows_use_agent_loops(self.agent_runner, prompts):
            out = engine_agent_rollout(self.agent_runner, self.engine, prompts, sampling,
                                       self.config.engine_max_model_len, version)
        elif self.engine is None:
            out = self._generate_from_text(prompts, sampling)
        else:
            out = self.engine.generate(prompts, sampling)
        return out

    def scores_text_rollouts(self, data: DataProto) -> bool:
        """Whether `data` is a text-hook rollout that compute_log_prob completes with "rollout_log_probs"."""
        return self.text_hook is not None and "rollout_log_probs" not in data.batch.keys()

    def global_rollout_rate(self, out: DataProto, seconds: float) -> dict[str, float]:
        """Tokens generated by every TP group over the slowest group's time (all ranks call this together)."""
        collects = self.layout.coord(self.rank).is_collect  # one count per TP group
        tokens = float(out.batch["response_mask"].sum()) if collects else 0.0
        totals = torch.tensor([tokens], dtype=torch.float64)
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(totals)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return rollout_rate(float(totals), float(slowest))

    def _generate_from_text(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        texts = [self.tokenizer.decode(tokens) for tokens in prompt_token_lists(prompts)]
        requests = [text for text in texts for _ in range(sampling.n)]
        outputs = self.text_hook(requests)
        if len(outputs) != len(requests) or not all(isinstance(text, str) for text in outputs):
            raise TypeError(
                f"{self.owner}.generate returned {len(outputs)} items for {len(requests)} prompts; it must "
                "return one str per prompt"
            )
        responses = [self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_tokens] for text in outputs]
        unscored = [[0.0] * len(tokens) for tokens in responses]
        pad = self.tokenizer.pad_token_id
        batch = build_rollout_batch(prompts, responses, unscored, sampling, pad, generation_metrics(responses))
        # A custom engine gives text, not log-probs: compute_log_prob adds "rollout_log_probs" from its forward.
        del batch.batch["rollout_log_probs"]
        return batch

    def close(self) -> None:
        """Shuts the engine down cleanly (frees its shared memory; a killed process leaks it)."""
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        self.engine = None


class ServerRolloutLink:
    """The rollout lives in servers (module doc): nothing to wake or put to sleep, the sync check asks them."""

    engine = None
    agent_runner = None
    reloads_on_wake = False

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config

    def before_sync(self, transport: WeightTransport) -> None:
        pass

    def after_sync(self) -> None:
        pass

    def sync_check(self, engine: TrainEngine, transport: WeightTransport, version: int,
                   vocab_size: Callable[[], int]) -> dict[str, float]:
        """rollout/sync_check.py against every server (rank 0 holds the transport's clients, the other ranks [];
        every rank takes part: the trainer's side of the probe is a collective)."""
        from verl_like.rollout import sync_check

        config = self.config
        clients = getattr(transport, "clients", None)
        if not config.sync_check or clients is None:
            return {}
        wire = engine.compute_dtype if config.dtype == "auto" else getattr(torch, config.dtype)
        limit = sync_check.tolerance([wire, engine.compute_dtype], config.sync_check_tolerance)
        return sync_check.check_servers(engine, clients, limit, version, vocab_size(), config.engine_max_model_len,
                                        getattr(transport, "adapter_name", None))

    def wake(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def sampling(self, prompts: DataProto) -> SamplingConfig:
        raise RuntimeError("generate_sequences: actor_rollout_ref.rollout.mode=server generates in the vLLM "
                           "servers (trainer/rollout_handle.py), not in the trainer's workers")

    def generate(self, prompts: DataProto, sampling: SamplingConfig, version: int) -> DataProto:
        return self.sampling(prompts)

    def scores_text_rollouts(self, data: DataProto) -> bool:
        return False

    def global_rollout_rate(self, out: DataProto, seconds: float) -> dict[str, float]:
        raise RuntimeError("the rollout has no TP groups in this group (rollout.mode=server)")

    def close(self) -> None:
        pass
