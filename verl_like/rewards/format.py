"""Format scorers: does a response follow a required shape? For custom rewards that add a format term.

Each returns `score` when the response has the format and 0.0 otherwise.
"""

from __future__ import annotations

import re

_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_GSM8K_ANSWER_LINE = re.compile(r"(?m)^\s*####\s*-?[0-9][0-9,]*(?:\.[0-9]+)?\s*$")


def regex_format_score(solution_str: str, pattern: str, score: float = 1.0) -> float:
    """`score` when the whole response matches `pattern` (re.fullmatch, DOTALL)."""
    return score if re.fullmatch(pattern, solution_str, re.DOTALL) else 0.0


def think_answer_format_score(solution_str: str, score: float = 1.0) -> float:
    """`score` for exactly `<think>...</think><answer>...</answer>` (whitespace around the tags allowed)."""
    if not _THINK_ANSWER.match(solution_str):
        return 0.0
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return score if all(solution_str.count(tag) == 1 for tag in tags) else 0.0


def boxed_format_score(solution_str: str, score: float = 1.0) -> float:
    """`score` when the response holds exactly one \\boxed{...} with balanced braces."""
    from verl_like.rewards.math import last_boxed_content

    if solution_str.count("\\boxed") != 1:
        return 0.0
    return score if last_boxed_content(solution_str) is not None else 0.0


def gsm8k_format_score(solution_str: str, score: float = 1.0) -> float:
    """`score` when the response has a line of the form `#### <number>`."""
    return score if _GSM8K_ANSWER_LINE.search(solution_str) else 0.0
