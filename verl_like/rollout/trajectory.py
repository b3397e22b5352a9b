"""The trajectory ledger: what a multi-turn rollout returns per sample, and the padded batch built from it.

A trajectory holds the exact token ids of a prompt and of every turn after it (assistant tokens sampled by the
policy; tool, environment and chat-template tokens inserted between them). Nothing is re-tokenised: the next
turn's prompt is the ids so far plus the inserted ones. Per response token it records whether the loss trains on
it (`loss_mask`) and, where it does not, why (`LossMaskReason`), and the rollout log-prob of each sampled token.

The batch (`build_trajectory_batch`) is verl's agent-loop layout: `prompts` left-padded, `responses` right-padded,
`attention_mask` 1 on every real token (tool tokens included), `response_mask` = the loss mask (1 only on sampled
tokens), `position_ids` = clamp(cumsum(attention_mask) - 1, 0), `rollout_log_probs` 0 off the loss mask, and
`loss_mask_reason` (int8, the reason code of every response position). Every loss and metric reads
`response_mask`, so tool tokens are never trained on, counted as response length, or penalised.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl_like.data.mrope import MROPE_POSITIONS
from verl_like.protocol import DataProto
from verl_like.rollout.batch import PROMPT_KEYS


class LossMaskReason(enum.IntEnum):
    """Why a token is (not) trained on; stored per response position in `loss_mask_reason`."""

    TRAINED = 0  # sampled by the policy: the loss trains on it
    PROMPT = 1  # part of the prompt (a forked sample's earlier turns become its prompt)
    TOOL = 2  # a tool's or environment's output
    TEMPLATE = 3  # chat-template tokens inserted between turns (role markers, turn ends)
    PADDING = 4  # after the trajectory's end
    TRUNCATED = 5  # after the end of a trajectory that the response budget cut
    INFRA_FAILURE = 6  # a tool raised, hung or crashed: the whole sample is left out of the loss and the baseline


@dataclass
class Trajectory:
    """One sample: the ledger of a (multi-turn) rollout.

    prompt_ids: the first prompt's ids (what the first turn was conditioned on).
    response_ids: every id after the prompt, in order: sampled turns and inserted tokens.
    mask_reason: per response id, a `LossMaskReason` (TRAINED exactly where the loss trains).
    log_probs: per response id, the rollout log-prob of a sampled id, 0.0 for inserted ones.
    turn_starts: offsets in response_ids where each assistant turn begins. turn_versions: the weight version that
      sampled each assistant turn's last token; turns_across_update: turns a weight update froze and the next
      version finished (partial rollout). turn_rewards: per-turn rewards a tool or environment gave.
    reward_score: a final reward the agent loop computed itself (None: the reward manager scores the sample).
    num_turns: chat turns (user, assistant, tool). tool_calls / tool_errors / malformed_calls: counts.
    infra_failure: why the sample failed through no fault of the policy (tool raised, hung, crashed), else None.
    truncated: the response budget cut the trajectory.
    extra: anything the loop adds (kept per sample in the batch's non-tensor column "agent_extra").
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask_reason: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)
    turn_versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turns_across_update: int = 0
    reward_score: float | None = None
    num_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0
    infra_failure: str | None = None
    truncated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loss_mask(self) -> list[int]:
        """1 where the loss trains (sampled tokens of a sample that did not fail), else 0."""
        if self.infra_failure is not None:
            return [0] * len(self.response_ids)
        return [int(reason == LossMaskReason.TRAINED) for reason in self.mask_reason]

    def add_sampled(self, token_ids: Sequence[int], log_probs: Sequence[float], version: int = 0) -> None:
        """Appends one assistant turn the policy sampled."""
        if len(token_ids) != len(log_probs):
            raise ValueError(f"a sampled turn has {len(token_ids)} ids but {len(log_probs)} log-probs")
        self.turn_starts.append(len(self.response_ids))
        self.turn_versions.append(version)
        self.response_ids.extend(int(t) for t in token_ids)
        self.log_probs.extend(float(lp) for lp in log_probs)
        self.mask_reason.extend([LossMaskReason.TRAINED] * len(token_ids))

    def add_inserted(self, token_ids: Sequence[int], reason: LossMaskReason) -> None:
        """Appends ids the policy did not sample (tool output, template tokens)."""
        if reason == LossMaskReason.TRAINED:
            raise ValueError("inserted tokens cannot be TRAINED; use add_sampled for the policy's own tokens")
        self.response_ids.extend(int(t) for t in token_ids)
        self.log_probs.extend([0.0] * len(token_ids))
        self.mask_reason.extend([int(reason)] * len(token_ids))

    def check(self) -> None:
        """Raises ValueError when the per-token lists disagree in length."""
        n = len(self.response_ids)
        if len(self.mask_reason) != n or len(self.log_probs) != n:
            raise ValueError(
                f"trajectory ledger out of step: {n} response ids, {len(self.mask_reason)} mask reasons, "
                f"{len(self.log_probs)} log-probs"
            )

    def cut(self, limit: int) -> None:
        """Keeps the first `limit` response ids (the response budget); marks the trajectory truncated if it cut."""
        if len(self.response_ids) <= limit:
            return
        self.truncated = True
        del self.response_ids[limit:], self.mask_reason[limit:], self.log_probs[limit:]
        kept = [i for i, start in enumerate(self.turn_starts) if start < limit]
        self.turn_starts = [self.turn_starts[i] for i in kept]
        self.turn_versions = [self.turn_versions[i] for i in kept]


def build_trajectory_batch(
    prompts: DataProto,
    trajectories: Sequence[Trajectory],
    n: int,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    metrics: dict[str, float],
) -> DataProto:
    """The rollout batch of `trajectories` (layout in the module doc); `trajectories[i*n + j]` is sample j of
    prompt row i. `prompts` is left-padded to `prompt_length` (or the input's width, if wider) so that the batches
    of several workers concatenate; a longer prompt raises. Prompt columns other than the prompt tensors are
    repeated n times, as for single-turn rollouts; non-tensor columns added: agent_reward (the loop's own score
    or None), agent_num_turns, agent_turn_versions (the version of each assistant turn), agent_extra."""
    rows = len(prompts) * n
    if len(trajectories) != rows:
        raise ValueError(f"expected {rows} trajectories ({len(prompts)} prompts x n={n}), got {len(trajectories)}")
    prompt_width = max(prompt_length, prompts.batch["input_ids"].shape[1])
    for row, trajectory in enumerate(trajectories):
        trajectory.check()
        trajectory.cut(response_length)
        if len(trajectory.prompt_ids) > prompt_width:
            raise ValueError(
                f"sample {row}: the agent loop's prompt has {len(trajectory.prompt_ids)} tokens, more than "
                f"actor_rollout_ref.rollout.prompt_length={prompt_length} (tool schemas in the chat template add "
                "tokens); raise data.max_prompt_length")
    prompt_ids = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_width), dtype=torch.long)
    response_ids = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((rows, response_length), dtype=torch.long)
    loss_mask = torch.zeros((rows, response_length), dtype=torch.long)
    reasons = torch.full((rows, response_length), int(LossMaskReason.PADDING), dtype=torch.int8)
    rollout_log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
    for row, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        if p == 0:
            raise ValueError(f"trajectory {row} has no prompt ids")
        prompt_ids[row, prompt_width - p:] = torch.as_tensor(t.prompt_ids, dtype=torch.long)
        prompt_mask[row, prompt_width - p:] = 1
        if r:
            response_ids[row, :r] = torch.as_tensor(t.response_ids, dtype=torch.long)
            response_attention[row, :r] = 1
            loss_mask[row, :r] = torch.as_tensor(t.loss_mask, dtype=torch.long)
            rollout_log_probs[row, :r] = torch.as_tensor(t.log_probs, dtype=torch.float32) * loss_mask[row, :r]
            row_reasons = torch.as_tensor(t.mask_reason, dtype=torch.int8)
            if t.infra_failure is not None:
                row_reasons = torch.full_like(row_reasons, int(LossMaskReason.INFRA_FAILURE))
            reasons[row, :r] = row_reasons
        if t.truncated:
            reasons[row, r:] = int(LossMaskReason.TRUNCATED)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=1) - 1, min=0)
    tensors = {
        key: value.repeat_interleave(n, dim=0) for key, value in prompts.batch.items() if key not in PROMPT_KEYS
    }
    tensors.update(
        prompts=prompt_ids,
        responses=response_ids,
        response_mask=loss_mask,
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=attention_mask,
        position_ids=position_ids,
        rollout_log_probs=rollout_log_probs,
        loss_mask_reason=reasons,
    )
    if MROPE_POSITIONS in prompts.batch.keys():
        tensors[MROPE_POSITIONS] = _mrope_positions(prompts, trajectories, n, prompt_width, response_attention)
    non_tensors = {key: np.repeat(value, n, axis=0) for key, value in prompts.non_tensor_batch.items()}
    non_tensors["agent_reward"] = np.array([t.reward_score for t in trajectories], dtype=object)
    non_tensors["agent_num_turns"] = np.array([t.num_turns for t in trajectories], dtype=object)
    non_tensors["agent_turn_versions"] = [list(t.turn_versions) for t in trajectories]
    non_tensors["agent_extra"] = np.array([dict(t.extra) for t in trajectories], dtype=object)
    meta_info = dict(prompts.meta_info)
    meta_info["metrics"] = {**meta_info.get("metrics", {}), **metrics}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)


def _mrope_positions(prompts: DataProto, trajectories: Sequence[Trajectory], n: int, prompt_width: int,
                     response_attention: torch.Tensor) -> torch.Tensor:
    """(rows, 3, prompt_width + response_len) M-RoPE positions (Qwen2-VL, data/mrope.py): each trajectory's prompt
    takes the dataset prompt's positions, its response counts on over its valid tokens. Raises naming the sample
    whose prompt is not the dataset's: its image positions would have to be recomputed, which loops do not do."""
    source = prompts.batch[MROPE_POSITIONS].repeat_interleave(n, dim=0)
    ids = prompts.batch["input_ids"].repeat_interleave(n, dim=0)
    valid = prompts.batch["attention_mask"].repeat_interleave(n, dim=0).bool()
    positions = torch.zeros((len(trajectories), 3, prompt_width), dtype=source.dtype)
    for row, trajectory in enumerate(trajectories):
        if ids[row][valid[row]].tolist() != list(trajectory.prompt_ids):
            raise ValueError(
                f"sample {row}: the agent loop's prompt is not the dataset's prompt; an M-RoPE model (Qwen2-VL / "
                "Qwen2.5-VL) takes its image positions from the dataset's prompt, so a loop on image prompts must "
                "start from it (docs/vision.md)"
            )
        positions[row, :, prompt_width - len(trajectory.prompt_ids):] = source[row][:, valid[row]]
    start = positions.amax(dim=(1, 2), keepdim=True) + 1
    response = start + (torch.cumsum(response_attention, dim=1) - 1).clamp(min=0).unsqueeze(1).to(source.dtype)
    return torch.cat([positions, response.expand(-1, 3, -1)], dim=2)


def infra_failed_rows(batch: DataProto) -> torch.Tensor:
    """`(batch,)` bool: rows whose trajectory failed through infrastructure (all False for single-turn rollouts)."""
    if "loss_mask_reason" not in batch.batch.keys():
        return torch.zeros(len(batch), dtype=torch.bool)
    return (batch.batch["loss_mask_reason"] == int(LossMaskReason.INFRA_FAILURE)).any(dim=-1)


def trajectory_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """agent/* metrics of one rollout: turns, tool calls, errors, malformed calls and infra failures per sample."""
    count = max(len(trajectories), 1)
    calls = sum(t.tool_calls for t in trajectories)
    return {
        "agent/num_turns/mean": sum(t.num_turns for t in trajectories) / count,
        "agent/num_turns/max": float(max((t.num_turns for t in trajectories), default=0)),
        "agent/tool_calls_per_sample": calls / count,
        "agent/tool_calls": float(calls),
        "agent/tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "agent/malformed_calls": float(sum(t.malformed_calls for t in trajectories)),
        "agent/infra_failures": float(sum(t.infra_failure is not None for t in trajectories)),
        "agent/truncated_fraction": sum(t.truncated for t in trajectories) / count,
        "agent/turns_across_update": float(sum(t.turns_across_update for t in trajectories)),
        "agent/mixed_version_samples": sum(len(set(t.turn_versions)) > 1 or t.turns_across_update > 0
                                           for t in trajectories) / count,
    }
