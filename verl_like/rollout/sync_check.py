"""The sync check: after a weight sync, does the rollout engine serve the policy the trainer holds?

The failure users of other frameworks report most is an engine that never got the new weights (or adapter) while
training looked fine. After every sync the engine scores one fixed probe sequence (a prompt-log-prob forward) and
the trainer scores the same tokens; the mean |engine - trainer| log-prob gap over the probe's scored tokens must
stay within the tolerance of the lower-precision side, else the step fails with `SyncCheckError` naming the
engine (or server) and both versions. Cheap: one forward of PROBE_LENGTH tokens on each side.

It catches what changes the probe's log-probs by more than the dtype's noise: a stale or missing adapter once
training has moved the policy, wrong or partial weights, a mis-scaled adapter. A change smaller than the
tolerance (the first steps of a tiny learning rate) passes; the step after it does not, once it has grown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from verl_like.protocol import DataProto

logger = logging.getLogger(__name__)

# The largest mean per-token gap a correct sync shows, by the compute dtype of the less precise side (fp32 on
# CPU measures ~1e-6; bf16 engines against fp32 trainers measure 1e-2 on real models).
DTYPE_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1}
PROBE_LENGTH = 24
PROBE_SCORED_FROM = 8  # tokens before this position are context only
_PROBE_SEED = 20260


class SyncCheckError(RuntimeError):
    """The rollout engine's log-probs on the probe differ from the trainer's by more than the tolerance."""


def probe_token_ids(vocab_size: int, length: int = PROBE_LENGTH) -> list[int]:
    """The fixed probe: `length` token ids drawn from [0, vocab_size) with a fixed seed (the same every run)."""
    generator = torch.Generator().manual_seed(_PROBE_SEED)
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


def probe(vocab_size: int, max_model_len: int | None = None) -> tuple[list[int], int]:
    """The probe's token ids and the position its scored tokens start at, fitted to the engine's context limit (a
    prompt-log-prob request needs one token of room to generate): PROBE_LENGTH tokens scored from PROBE_SCORED_FROM,
    or as many as fit with the first third as context."""
    length = PROBE_LENGTH if max_model_len is None else max(2, min(PROBE_LENGTH, max_model_len - 1))
    return probe_token_ids(vocab_size, length), min(PROBE_SCORED_FROM, max(1, length // 3))


def probe_batch(token_ids: list[int], start: int = PROBE_SCORED_FROM) -> DataProto:
    """One row in the rollout's layout: prompt token_ids[:start], response token_ids[start:], no padding."""
    ids = torch.tensor([token_ids], dtype=torch.long)
    return DataProto.from_dict(tensors={
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(len(token_ids)).unsqueeze(0),
        "responses": ids[:, start:],
        "response_mask": torch.ones_like(ids[:, start:]),
    })


def tolerance(dtypes: list[torch.dtype | None], override: float | None = None) -> float:
    """`override`, else the tolerance of the least precise of `dtypes` (None entries ignored; fp32 if none)."""
    if override is not None:
        return override
    known = [DTYPE_TOLERANCE.get(dtype, DTYPE_TOLERANCE[torch.bfloat16]) for dtype in dtypes if dtype is not None]
    return max(known, default=DTYPE_TOLERANCE[torch.float32])


@dataclass(frozen=True)
class SyncCheckResult:
    """The gap of one engine: mean and max |engine - trainer| over the probe's scored tokens."""

    engine: str
    gap: float
    gap_max: float

    def metrics(self) -> dict[str, float]:
        return {"rollout/sync_check_gap": self.gap, "rollout/sync_check_gap_max": self.gap_max}


def compare(engine_log_probs: list[float], trainer_log_probs: torch.Tensor, limit: float, engine: str,
            engine_version: int | None, trainer_version: int) -> SyncCheckResult:
    """The gap of `engine`'s probe log-probs against the trainer's; SyncCheckError above `limit`."""
    served = torch.tensor(engine_log_probs, dtype=torch.float64)
    trained = trainer_log_probs.to(torch.float64).flatten()
    if served.shape != trained.shape:
        raise SyncCheckError(f"sync check: {engine} scored {served.numel()} probe tokens, the trainer "
                             f"{trained.numel()}")
    gaps = (served - trained).abs()
    result = SyncCheckResult(engine, float(gaps.mean()), float(gaps.max()))
    if not result.gap <= limit:  # also fails on NaN
        raise SyncCheckError(
            f"sync check failed: {engine} holding version {engine_version} does not serve the trainer's policy of "
            f"version {trainer_version}: mean |log-prob gap| {result.gap:.3g} (max {result.gap_max:.3g}) over "
            f"{gaps.numel()} probe tokens exceeds the tolerance {limit:.3g}. The weights (or the LoRA adapter) did "
            "not arrive intact; set actor_rollout_ref.rollout.sync_check=false only to debug past it"
        )
    return result


def trainer_probe_log_probs(train_engine, token_ids: list[int], start: int = PROBE_SCORED_FROM) -> torch.Tensor:
    """The trainer's log-probs (temperature 1) of the probe's scored tokens; a collective on the engine's group
    (every rank scores the same probe)."""
    return train_engine.forward(probe_batch(token_ids, start), temperature=1.0).batch["log_probs"][0]


def check_colocated(train_engine, rollout, limit: float, engine: str, engine_version: int | None,
                    trainer_version: int, vocab_size: int, max_model_len: int | None = None) -> SyncCheckResult:
    """Scores the probe in the in-process `rollout` engine and in `train_engine` and compares them."""
    token_ids, start = probe(vocab_size, max_model_len)
    trained = trainer_probe_log_probs(train_engine, token_ids, start)
    served = rollout.score_log_probs(token_ids, start)
    result = compare(served, trained, limit, engine, engine_version, trainer_version)
    logger.debug("sync check %s: gap %.3g (max %.3g)", engine, result.gap, result.gap_max)
    return result


def server_probe_log_probs(client, token_ids: list[int], start: int = PROBE_SCORED_FROM) -> list[float]:
    """A server's log-probs (temperature 1) of tokens start.. of `token_ids`, from one scoring request of its
    ServerBackend (vLLM's: /v1/completions with prompt_logprobs=0)."""
    answer = client.send(client.backend.score_request(token_ids, client.model))
    try:
        return client.backend.prompt_log_probs(answer, token_ids, start)
    except ValueError as err:
        raise SyncCheckError(f"sync check: {client} returned {err}") from err


def server_adapter_probe_log_probs(client, token_ids: list[int], start: int, adapter: str) -> list[float]:
    """`server_probe_log_probs` on a LoRA server, under `adapter` (rollout/server_lora.py's scoring route: a LoRA
    server refuses adapter-less requests)."""
    from verl_like.rollout.server_lora import score_prompt

    return score_prompt(client, token_ids, adapter, start)


def check_servers(train_engine, clients: list, limit: float, trainer_version: int, vocab_size: int,
                  max_model_len: int | None = None, adapter: str | None = None) -> dict[str, float]:
    """Scores the probe on every server in `clients` (rank 0's; other ranks pass []) and in `train_engine` (every
    rank: a collective), under LoRA `adapter` when given; SyncCheckError naming the first server (and the adapter)
    whose gap exceeds `limit`. The largest gap."""
    token_ids, start = probe(vocab_size, max_model_len)
    trained = trainer_probe_log_probs(train_engine, token_ids, start)
    results = []
    for index, client in enumerate(clients):
        if adapter is None:
            served, label = server_probe_log_probs(client, token_ids, start), str(client)
        else:
            served = server_adapter_probe_log_probs(client, token_ids, start, adapter)
            label = f"{client} (server index {index}, adapter {adapter})"
        results.append(compare(served, trained, limit, label, trainer_version, trainer_version))
    if not results:
        return {}
    return {"rollout/sync_check_gap": max(r.gap for r in results),
            "rollout/sync_check_gap_max": max(r.gap_max for r in results)}
