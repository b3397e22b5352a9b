"""On-policy distillation losses over the teacher's top-k tokens.

Agarwal et al. 2024, "On-Policy Distillation of Language Models" (GKD, arXiv:2306.13649); Gu et al. 2024, "MiniLLM"
(reverse KL). At each response position the teacher returns its k most likely tokens S and their log-probs; the
student's log-probs are read at the same tokens. Both are renormalised over S:
    p(i) = exp(t_i) / sum_{j in S} exp(t_j),   q(i) = exp(s_i) / sum_{j in S} exp(s_j)
(t: teacher, s: student log-probs over the whole vocabulary). Then per token
    forward_kl = sum_S p (log p - log q)        reverse_kl = sum_S q (log q - log p)
    jsd        = 0.5 KL(p || m) + 0.5 KL(q || m),  m = (p + q) / 2
Departures, one line each:
- The divergences are over the top-k support only (renormalised), not the full vocabulary: the teacher engine
  returns k log-probs, and the student's mass outside S gets no gradient.
- The JSD uses beta = 0.5 (GKD's generalised JSD with a fixed mixture).
"""

from __future__ import annotations

import torch

from verl_like.config.names import DISTILLATION_LOSSES



def _renormalised(log_probs: torch.Tensor) -> torch.Tensor:
    return log_probs - torch.logsumexp(log_probs, dim=-1, keepdim=True)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def topk_divergence(
    student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor, loss: str
) -> torch.Tensor:
    """Per-token divergence `(batch, response_len)` from log-probs at the teacher's top-k tokens.

    student_topk_log_probs / teacher_topk_log_probs: `(batch, response_len, k)`, the student's and the
    teacher's log-probs (over the full vocabulary) of the same k tokens. The teacher carries no gradient.
    """
    if student_topk_log_probs.shape != teacher_topk_log_probs.shape:
        raise ValueError(
            f"student_topk_log_probs{tuple(student_topk_log_probs.shape)} and teacher_topk_log_probs"
            f"{tuple(teacher_topk_log_probs.shape)} must have one shape (batch, response_len, k)"
        )
    dtype = torch.float64 if student_topk_log_probs.dtype == torch.float64 else torch.float32
    log_q = _renormalised(student_topk_log_probs.to(dtype))
    log_p = _renormalised(teacher_topk_log_probs.detach().to(dtype))
    if loss == "forward_kl":
        return _kl(log_p, log_q)
    if loss == "reverse_kl":
        return _kl(log_q, log_p)
    if loss == "jsd":
        log_m = torch.logsumexp(torch.stack([log_p, log_q]), dim=0) - torch.log(torch.tensor(2.0, dtype=dtype))
        return 0.5 * _kl(log_p, log_m) + 0.5 * _kl(log_q, log_m)
    raise ValueError(f"distillation.loss={loss!r} must be one of {DISTILLATION_LOSSES}")
