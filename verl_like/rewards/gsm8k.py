"""GSM8K scorer: the final number of a response against the reference answer.

strict: the number after the last '#### ' marker (GSM8K's own answer format); a response without it scores 0.
flexible: the last number anywhere in the response.
Numbers compare by value after removing thousands separators, '$' and a trailing period ("1,000.00" == "1000").
"""

from __future__ import annotations

import re

_NUMBER = r"-?[$]?\s*[0-9][0-9,]*(?:\.[0-9]+)?"
_STRICT = re.compile(r"####\s*(" + _NUMBER + r")")
_ANY_NUMBER = re.compile(_NUMBER)
METHODS = ("strict", "flexible")


def _normalize(number: str) -> str:
    return number.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer a response gives as a normalized number string, or None when it gives none."""
    if method not in METHODS:
        raise ValueError(f"gsm8k method={method!r}; use one of {METHODS}")
    pattern = _STRICT if method == "strict" else _ANY_NUMBER
    matches = pattern.findall(solution_str)
    if not matches:
        return None
    return _normalize(matches[-1])


def numbers_equal(a: str, b: str) -> bool:
    """True when two number strings have the same value (exact text match for non-numbers)."""
    a, b = _normalize(str(a).strip()), _normalize(str(b).strip())
    try:
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))
    except ValueError:
        return a == b


def compute_score(
    solution_str: str, ground_truth: str | int | float, method: str = "strict", format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` when the response's final number equals `ground_truth`, `format_score` when it gives a number that
    is wrong, 0 when it gives none."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if numbers_equal(answer, str(ground_truth)) else format_score
