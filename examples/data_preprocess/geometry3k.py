"""Converts local geometry3k-style files (an image and a geometry problem per row) into verl_like's image rows.

Input: the files as distributed (no hub access here), e.g. the Hugging Face parquet files of hiyouga/geometry3k
(`data/train-00000-of-00001.parquet`), with `images` (a list of {"bytes", "path"} or paths), `problem` (text whose
`<image>` marks the picture; one is put in front when the text has none) and `answer`. Output rows
(docs/vision.md):

    {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": problem + instruction}],
     "images": [{"bytes": ..., "path": ...}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split", "index", "problem"}}

The answer is scored by the MATH scorer (last \\boxed{...}, math-verify equivalence).

    python examples/data_preprocess/geometry3k.py --input geometry3k/train.parquet --split train \\
        --output data/geometry3k/train.parquet
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_like.data.preprocess import conversion_main

DATA_SOURCE = "hiyouga/geometry3k"
PLACEHOLDER = "<image>"
INSTRUCTION = " Reason step by step, then put the final answer in \\boxed{}."


def convert(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One geometry3k record -> one verl_like image row."""
    problem, answer, images = record.get("problem"), record.get("answer"), record.get("images")
    if not isinstance(problem, str) or answer is None:
        raise ValueError(f"geometry3k record {index} needs text 'problem' and an 'answer'; fields: {sorted(record)}")
    if isinstance(images, (str, bytes, dict)):
        images = [images]
    if not images:
        raise ValueError(f"geometry3k record {index} has no 'images'")
    found = problem.count(PLACEHOLDER)
    if found == 0:
        problem = PLACEHOLDER * len(images) + problem
    elif found != len(images):
        raise ValueError(f"geometry3k record {index}: {found} {PLACEHOLDER} in the problem for {len(images)} images")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": problem.strip() + INSTRUCTION}],
        "images": list(images),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "problem": problem},
    }


def main(argv: list[str] | None = None) -> Path:
    """Runs the conversion; returns the written file."""
    return conversion_main(convert, __doc__, argv)


if __name__ == "__main__":
    main()
