"""A reward function that breaks the way user scorers do: NaN on some validation rows, raises from step 2 on.

Scored in the driver (reward_model.scoring_workers=0), so the call counter spans the run.
"""

import math

TRAIN_SAMPLES_PER_STEP = 16  # ci_smoke: 8 prompts x rollout.n=2
_calls = {"train": 0}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    info = extra_info or {}
    if info.get("split") == "test":
        return math.nan if info["index"] % 3 == 0 else float(solution_str.strip() == str(ground_truth))
    _calls["train"] += 1
    if _calls["train"] > TRAIN_SAMPLES_PER_STEP:
        raise ValueError("grader service unavailable")
    return float(solution_str.strip() == str(ground_truth))
