"""Reward functions for the reward tests, loaded through verl_like.rewards.custom (so by file path)."""

import os
import time


def misbehaving(data_source, solution_str, ground_truth, extra_info=None):
    """Exact match, except that some ground truths make the function fail in one particular way."""
    if ground_truth == "raise":
        raise RuntimeError("scorer bug")
    if ground_truth == "hang":
        time.sleep(600)
    if ground_truth == "die":
        os._exit(3)
    if ground_truth == "none":
        return None
    if ground_truth == "nan":
        return float("nan")
    if ground_truth == "dict":
        return {"score": 0.25, "acc": 1}
    if ground_truth == "dict-without-score":
        return {"acc": 1}
    if ground_truth == "bool":
        return True
    return 1.0 if solution_str.strip() == ground_truth else 0.0


def takes_kwargs(**kwargs):
    return float(len(kwargs["solution_str"]))


def wrong_signature(text):
    return 0.0


NOT_A_FUNCTION = 3
