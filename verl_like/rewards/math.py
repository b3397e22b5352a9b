"""MATH scorer: the response's last \\boxed{...} answer against the reference, by mathematical equivalence.

Equivalence comes from the `math-verify` library (parses LaTeX to SymPy: 1/2 == \\frac{1}{2} == 0.5, sets,
intervals, units). Without it (it ships with the `cpu` and `vllm` extras) the boxed answers are compared as
normalized strings, which misses equivalent forms; a warning says so once per process.
"""

from __future__ import annotations

import logging
import re
import threading

logger = logging.getLogger(__name__)

_warned_fallback = False


def load_math_verify():
    """The math_verify module, or None when it is not installed (imported on first use: it takes ~1.5 s)."""
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


def last_boxed_content(text: str) -> str | None:
    r"""The content of the last \boxed{...} or \fbox{...} (balanced braces), or of `\boxed x`; None if absent."""
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\b", text)]
    if not starts:
        return None
    rest = text[starts[-1].end():]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):
        token = rest.strip().split()
        return token[0].rstrip(".$") if token else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced


_REMOVALS = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "$", "^\\circ", "^{\\circ}", "\\%", "%")


def normalize_answer(answer: str) -> str:
    """A string form of an answer for exact comparison: no spacing macros, \\dfrac/\\tfrac -> \\frac,
    `\\text{...}` unwrapped, no trailing period, no spaces."""
    answer = answer.strip()
    for token in _REMOVALS:
        answer = answer.replace(token, "")
    answer = re.sub(r"\\(?:d|t)frac", r"\\frac", answer)
    answer = re.sub(r"\\text\{(.*?)\}", r"\1", answer)
    answer = answer.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", answer):
        answer = answer.split(".")[0]
    return answer


def _verify(library, solution_str: str, ground_truth: str) -> bool:
    # math-verify guards its own parsing with SIGALRM, which only works in the main thread; the reward manager
    # enforces timeouts itself, so elsewhere the library's are switched off.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = library.parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout)
    predicted = library.parse(solution_str, parsing_timeout=timeout)
    if not gold or not predicted:
        return False
    return bool(library.verify(gold, predicted, timeout_seconds=timeout))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of `solution_str` is equivalent to `ground_truth`, else 0.0."""
    global _warned_fallback
    boxed = last_boxed_content(solution_str)
    if boxed is None:
        return 0.0
    library = load_math_verify()
    if library is not None:
        return 1.0 if _verify(library, f"\\boxed{{{boxed}}}", str(ground_truth)) else 0.0
    if not _warned_fallback:
        _warned_fallback = True
        logger.warning(
            "math-verify is not installed: MATH answers are compared as normalized strings, which misses "
            "equivalent forms (0.5 vs \\frac{1}{2}); install it with pip install 'math-verify[antlr4_9_3]'"
        )
    return 1.0 if normalize_answer(boxed) == normalize_answer(str(ground_truth)) else 0.0
