"""Online DPO: the loss and its gradients against a float64 reference, and the judge's pair selection."""

from __future__ import annotations

import math

import pytest
import torch

import algo_reference as ref
from verl_like.algorithms.dpo import dpo_loss, select_preference_pairs, sequence_log_probs

PAIRS = 7


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _reference_loss(pc: float, pr: float, rc: float, rr: float, beta: float, loss_type: str, eps: float) -> float:
    """DPO (Rafailov et al. 2023, eq. 7) with conservative label smoothing, and IPO (Azar et al. 2023, eq. 17)."""
    h = (pc - rc) - (pr - rr)
    if loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)) ** 2
    return -(1 - eps) * _log_sigmoid(beta * h) - eps * _log_sigmoid(-beta * h)


def _reference_grad_chosen(pc: float, pr: float, rc: float, rr: float, beta: float, loss_type: str, eps: float) -> float:
    """d loss / d log pi(y_w), derived by hand (d/d log pi(y_l) is its negative)."""
    h = (pc - rc) - (pr - rr)
    if loss_type == "ipo":
        return 2.0 * (h - 1.0 / (2.0 * beta))
    sig = 1.0 / (1.0 + math.exp(-beta * h))
    return -(1 - eps) * beta * (1 - sig) + eps * beta * sig


def _inputs(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [-torch.rand(PAIRS, generator=gen, dtype=torch.float64) * 20 for _ in range(4)]


@pytest.mark.parametrize(
    "loss_type,beta,eps", [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("ipo", 0.1, 0.0), ("ipo", 1.0, 0.0)]
)
def test_dpo_loss_and_gradients_match_float64_reference(loss_type: str, beta: float, eps: float) -> None:
    pc, pr, rc, rr = _inputs(0)
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    out = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type=loss_type, label_smoothing=eps)
    rows = list(zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist()))
    expected = torch.tensor([_reference_loss(*r, beta, loss_type, eps) for r in rows], dtype=torch.float64)
    ref.assert_close(out.losses.detach(), expected, rtol=1e-12, atol=1e-12)
    grad_c, grad_r = torch.autograd.grad(out.losses.sum(), [pc, pr])
    expected_grad = torch.tensor([_reference_grad_chosen(*r, beta, loss_type, eps) for r in rows], dtype=torch.float64)
    ref.assert_close(grad_c, expected_grad, rtol=1e-10, atol=1e-12)
    ref.assert_close(grad_r, -expected_grad, rtol=1e-10, atol=1e-12)
    ref.assert_close(out.chosen_rewards, beta * (pc - rc).detach(), rtol=1e-12, atol=1e-12)
    ref.assert_close(out.rejected_rewards, beta * (pr - rr).detach(), rtol=1e-12, atol=1e-12)


def test_dpo_loss_sends_no_gradient_into_the_reference() -> None:
    pc, pr, rc, rr = _inputs(1)
    rc.requires_grad_(True)
    out = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert not out.losses.requires_grad
    assert out.losses.dtype == torch.float64


def test_dpo_loss_is_log2_when_policy_equals_reference() -> None:
    pc, pr, _, _ = _inputs(2)
    out = dpo_loss(pc, pr, pc.clone(), pr.clone(), beta=0.3)
    ref.assert_close(out.losses, torch.full((PAIRS,), math.log(2.0), dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs,message",
    [({"beta": 0.0}, "beta"), ({"beta": 0.1, "loss_type": "hinge"}, "loss_type"),
     ({"beta": 0.1, "label_smoothing": 0.5}, "label_smoothing")],
)
def test_dpo_loss_rejects_bad_settings_naming_the_key(kwargs: dict, message: str) -> None:
    pc, pr, rc, rr = _inputs(3)
    with pytest.raises(ValueError, match=f"online_dpo.{message}"):
        dpo_loss(pc, pr, rc, rr, **kwargs)


def test_sequence_log_probs_sum_only_response_tokens() -> None:
    log_probs = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, -0.25, -0.125]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    ref.assert_close(sequence_log_probs(log_probs, mask), torch.tensor([-3.0, -0.625], dtype=torch.float64))


def test_pairs_take_best_and_worst_sample_of_each_prompt_in_prompt_order() -> None:
    scores = torch.tensor([0.0, 1.0, 0.5, 0.2, 0.9, 0.9, 0.1, 0.3])
    groups = torch.tensor([3, 3, 3, 3, 1, 1, 1, 1])
    pairs = select_preference_pairs(scores, groups)
    assert pairs.chosen.tolist() == [1, 4]  # the earliest of the tied best wins
    assert pairs.rejected.tolist() == [0, 6]
    assert pairs.valid.tolist() == [True, True]


def test_all_equal_prompt_is_skipped_or_paired_at_random_as_configured() -> None:
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    skipped = select_preference_pairs(scores, groups, tie_breaking="skip")
    assert skipped.valid.tolist() == [False, True]
    broken = select_preference_pairs(scores, groups, tie_breaking="random", generator=torch.Generator().manual_seed(0))
    assert broken.valid.tolist() == [True, True]
    assert broken.chosen[0] != broken.rejected[0] and {int(broken.chosen[0]), int(broken.rejected[0])} <= {0, 1, 2}


def test_pairs_need_two_samples_per_prompt() -> None:
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        select_preference_pairs(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]))
