"""Scorer of the synthetic tasks (verl_like/data/synthetic.py): exact match of the whole response."""

from __future__ import annotations


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response, stripped of surrounding whitespace, is exactly `ground_truth`; else 0.0."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


def compute_answer_score(solution_str: str, ground_truth: str, prefix: str = "answer:") -> float:
    """1.0 when the text after the last `prefix` in the response is exactly `ground_truth` (multi-turn tasks:
    the final answer, not the tool replies before it); 0.0 without the prefix."""
    if prefix not in solution_str:
        return 0.0
    return 1.0 if solution_str.rsplit(prefix, 1)[1].strip() == str(ground_truth).strip() else 0.0
