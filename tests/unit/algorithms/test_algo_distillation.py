"""Top-k distillation divergences and their gradients against a float64 loop reference."""

from __future__ import annotations

import math

import pytest
import torch

import algo_reference as ref
from verl_like.algorithms.distillation import DISTILLATION_LOSSES, topk_divergence

BATCH, LENGTH, K = 3, 4, 5


def _renormalise(values: list[float]) -> list[float]:
    top = max(values)
    log_z = top + math.log(sum(math.exp(v - top) for v in values))
    return [math.exp(v - log_z) for v in values]


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0)


def _reference(student: list[float], teacher: list[float], loss: str) -> float:
    """The divergence over the top-k support, both distributions renormalised there (docs/algorithms.md)."""
    q, p = _renormalise(student), _renormalise(teacher)
    if loss == "forward_kl":
        return _kl(p, q)
    if loss == "reverse_kl":
        return _kl(q, p)
    m = [(a + b) / 2 for a, b in zip(p, q)]
    return 0.5 * _kl(p, m) + 0.5 * _kl(q, m)


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # Log-probs over a full vocabulary, so their top-k sums stay below 1 (what the models return).
    student = torch.log_softmax(torch.randn(BATCH, LENGTH, 32, generator=gen, dtype=torch.float64), -1)[..., :K]
    teacher = torch.log_softmax(3 * torch.randn(BATCH, LENGTH, 32, generator=gen, dtype=torch.float64), -1)[..., :K]
    return student, teacher


@pytest.mark.parametrize("loss", DISTILLATION_LOSSES)
def test_divergence_matches_float64_reference(loss: str) -> None:
    student, teacher = _inputs(0)
    got = topk_divergence(student, teacher, loss)
    expected = [[_reference(s, t, loss) for s, t in zip(rs, rt)] for rs, rt in zip(student.tolist(), teacher.tolist())]
    ref.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss", DISTILLATION_LOSSES)
def test_gradient_matches_finite_differences_of_the_reference(loss: str) -> None:
    student, teacher = _inputs(1)
    student = student.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(topk_divergence(student, teacher, loss).sum(), student)
    h = 1e-6
    rows = student.detach().tolist()
    t_rows = teacher.tolist()
    for b, t, i in [(0, 0, 0), (1, 2, 3), (2, 3, 4)]:
        plus = [list(v) for v in rows[b][t:t + 1]][0]
        minus = list(plus)
        plus[i] += h
        minus[i] -= h
        numeric = (_reference(plus, t_rows[b][t], loss) - _reference(minus, t_rows[b][t], loss)) / (2 * h)
        assert abs(float(grad[b, t, i]) - numeric) < 1e-7, (loss, b, t, i)


@pytest.mark.parametrize("loss", DISTILLATION_LOSSES)
def test_divergence_is_zero_when_student_matches_teacher_up_to_mass_outside_top_k(loss: str) -> None:
    _, teacher = _inputs(2)
    shifted = teacher - 0.7  # same distribution over the top-k once renormalised
    ref.assert_close(topk_divergence(shifted, teacher, loss), torch.zeros(BATCH, LENGTH, dtype=torch.float64),
                     atol=1e-12)


def test_teacher_gets_no_gradient_and_bad_inputs_name_the_key() -> None:
    student, teacher = _inputs(3)
    teacher = teacher.clone().requires_grad_(True)
    div = topk_divergence(student, teacher, "jsd")
    assert not div.requires_grad
    with pytest.raises(ValueError, match="distillation.loss='kl'"):
        topk_divergence(student, teacher.detach(), "kl")
    with pytest.raises(ValueError, match="must have one shape"):
        topk_divergence(student[..., :2], teacher.detach(), "jsd")
