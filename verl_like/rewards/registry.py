"""data_source -> rule scorer, and `default_compute_score`, the reward function used when none is configured.

Scorers take `(solution_str, ground_truth)` and return a float. Register another with
`@register_scorer("my/data_source")`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from verl_like.rewards import gsm8k, math, synthetic

Scorer = Callable[[str, Any], float]
SCORERS: dict[str, Scorer] = {}


def register_scorer(*data_sources: str) -> Callable[[Scorer], Scorer]:
    """Decorator: `fn(solution_str, ground_truth) -> float` scores the rows of each of `data_sources`."""

    def decorate(fn: Scorer) -> Scorer:
        for source in data_sources:
            if source in SCORERS and SCORERS[source] is not fn:
                raise ValueError(f"a scorer for data_source {source!r} is already registered")
            SCORERS[source] = fn
        return fn

    return decorate


register_scorer("openai/gsm8k", "gsm8k")(gsm8k.compute_score)
register_scorer(
    "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math", "hendrycks/math",
    "hiyouga/geometry3k",  # image rows (examples/data_preprocess/geometry3k.py): a boxed answer, like MATH
)(math.compute_score)


def _register_synthetic() -> None:
    from verl_like.data.synthetic import TASKS, data_source_of

    register_scorer(*(data_source_of(name) for name, task in TASKS.items() if task.answer_prefix is None))(
        synthetic.compute_score)
    for name, task in TASKS.items():
        if task.answer_prefix is not None:
            register_scorer(data_source_of(name))(functools.partial(synthetic.compute_answer_score,
                                                                    prefix=task.answer_prefix))


_register_synthetic()


def get_scorer(data_source: str) -> Scorer:
    """The scorer registered for `data_source`; raises naming the registered sources."""
    if data_source not in SCORERS:
        raise KeyError(
            f"no rule scorer for data_source {data_source!r}; registered: {sorted(SCORERS)}. Register one with "
            "@register_scorer, or set custom_reward_function.path and custom_reward_function.name"
        )
    return SCORERS[data_source]


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """The score of one response from the scorer registered for its `data_source`."""
    return get_scorer(data_source)(solution_str, ground_truth)
