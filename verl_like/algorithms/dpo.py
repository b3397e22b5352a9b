"""Online DPO: preference pairs from a judge's scores, and the DPO loss against the reference policy.

Rafailov et al. 2023, "Direct Preference Optimization" (arXiv:2305.18290); IPO: Azar et al. 2023 (arXiv:2310.12036);
online DPO: Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback" (arXiv:2402.04792).
Departures from the papers, one line each:
- The judge is the run's reward (rule/custom scorer and/or the reward-model role), not an LLM annotator.
- With n > 2 samples per prompt the pair is (best, worst) by score; the other samples are not used.
- A prompt whose samples all score the same is skipped (`tie_breaking="skip"`) or paired at random ("random").
- Label smoothing applies to the sigmoid loss only (conservative DPO, as in TRL); IPO ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_like.algorithms.masked import check_same_shape
from verl_like.config.names import DPO_LOSS_TYPES, TIE_BREAKING



def sequence_log_probs(log_probs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sum of the response tokens' log-probs `(batch,)` from `(batch, response_len)` log-probs and mask."""
    check_same_shape(log_probs=log_probs, response_mask=response_mask)
    mask = response_mask.bool()
    return torch.where(mask, log_probs, torch.zeros_like(log_probs)).sum(-1)


@dataclass(frozen=True)
class DPOLossOutput:
    """Per-pair values `(pairs,)`: the loss, and the implicit rewards beta * (log pi - log pi_ref) (detached)."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def dpo_loss(
    chosen_log_probs: torch.Tensor,
    rejected_log_probs: torch.Tensor,
    ref_chosen_log_probs: torch.Tensor,
    ref_rejected_log_probs: torch.Tensor,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> DPOLossOutput:
    """The DPO loss of each pair from sequence log-probs `(pairs,)` of the policy and the reference.

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))
    sigmoid: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)       (eps = label_smoothing)
    ipo:     (h - 1 / (2 beta))^2
    The reference log-probs carry no gradient.
    """
    check_same_shape(
        chosen_log_probs=chosen_log_probs, rejected_log_probs=rejected_log_probs,
        ref_chosen_log_probs=ref_chosen_log_probs, ref_rejected_log_probs=ref_rejected_log_probs,
    )
    if not beta > 0:
        raise ValueError(f"online_dpo.beta={beta} must be > 0")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"online_dpo.label_smoothing={label_smoothing} must lie in [0, 0.5)")
    chosen_ratio = chosen_log_probs - ref_chosen_log_probs.detach()
    rejected_ratio = rejected_log_probs - ref_rejected_log_probs.detach()
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * torch.nn.functional.logsigmoid(beta * h)
        if label_smoothing > 0:
            losses = losses - label_smoothing * torch.nn.functional.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"online_dpo.loss_type={loss_type!r} must be one of {DPO_LOSS_TYPES}")
    return DPOLossOutput(
        losses=losses,
        chosen_rewards=beta * chosen_ratio.detach(),
        rejected_rewards=beta * rejected_ratio.detach(),
    )


@dataclass(frozen=True)
class PreferencePairs:
    """One pair per prompt: row indices into the rollout batch and whether the pair is kept.

    chosen / rejected: `(prompts,)` long; valid: `(prompts,)` bool (False: every sample scored the same and
    ties are skipped). Prompts appear in the order of their first sample in the batch.
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    valid: torch.Tensor


def select_preference_pairs(
    scores: torch.Tensor, group_ids: torch.Tensor, *, tie_breaking: str = "skip", generator: torch.Generator | None = None
) -> PreferencePairs:
    """(best, worst) sample of each prompt by `scores` `(batch,)`; `group_ids` `(batch,)` long names the prompt.

    Among equal best (or worst) scores the earliest sample wins. When all of a prompt's samples score the same,
    `tie_breaking="skip"` marks the pair invalid; "random" pairs two distinct samples drawn with `generator`.
    Every group needs at least two samples.
    """
    check_same_shape(scores=scores, group_ids=group_ids)
    if tie_breaking not in TIE_BREAKING:
        raise ValueError(f"online_dpo.tie_breaking={tie_breaking!r} must be one of {TIE_BREAKING}")
    chosen, rejected, valid = [], [], []
    seen: list[int] = []
    for gid in group_ids.tolist():
        if gid not in seen:
            seen.append(gid)
    for gid in seen:
        rows = torch.nonzero(group_ids == gid).flatten()
        if len(rows) < 2:
            raise ValueError(
                f"prompt group {gid} has {len(rows)} sample; online DPO needs actor_rollout_ref.rollout.n >= 2"
            )
        group_scores = scores[rows].double()
        best, worst = int(torch.argmax(group_scores)), int(torch.argmin(group_scores))
        tie = bool(group_scores[best] == group_scores[worst])
        if tie and tie_breaking == "random":
            best, worst = torch.randperm(len(rows), generator=generator)[:2].tolist()
        elif tie:
            best, worst = 0, 1
        chosen.append(int(rows[best]))
        rejected.append(int(rows[worst]))
        valid.append(not tie or tie_breaking == "random")
    return PreferencePairs(
        chosen=torch.tensor(chosen, dtype=torch.long),
        rejected=torch.tensor(rejected, dtype=torch.long),
        valid=torch.tensor(valid, dtype=torch.bool),
    )
