"""Converts local MATH files into verl_like's prompt format (one parquet or jsonl file per split).

Input: the files as distributed (no hub access here): the original release's folders of one-problem .json files
(`MATH/train/algebra/1.json`, ...), or the jsonl / parquet files of its Hugging Face copies (lighteval/MATH,
MATH-500). Records hold `problem` and `solution`; the reference answer is the `answer` field when present
(MATH-500), else the last \\boxed{...} of the solution. Output rows:

    {"data_source": "lighteval/MATH", "prompt": [{"role": "user", "content": problem + instruction}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "<answer>"},
     "extra_info": {"split": ..., "index": ..., "level": ..., "type": ...}}

    python examples/data_preprocess/math_dataset.py --input MATH/test --split test --output data/math/test.parquet
"""

from __future__ import annotations

from typing import Any

from verl_like.data.preprocess import conversion_main
from verl_like.rewards.math import last_boxed_content

DATA_SOURCE = "lighteval/MATH"
INSTRUCTION = " Reason step by step and put the final answer in \\boxed{}."


def reference_answer(record: dict[str, Any], index: int) -> str:
    """The record's `answer` field, or the last boxed expression of its `solution`."""
    if isinstance(record.get("answer"), str) and record["answer"].strip():
        return record["answer"].strip()
    boxed = last_boxed_content(record.get("solution") or "")
    if boxed is None:
        raise ValueError(f"MATH record {index} has no 'answer' field and no \\boxed{{}} answer in its solution")
    return boxed


def convert(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One MATH record -> one verl_like row."""
    if not isinstance(record.get("problem"), str):
        raise ValueError(f"MATH record {index} has no text field 'problem'; fields: {sorted(record)}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": record["problem"].strip() + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": reference_answer(record, index)},
        "extra_info": {
            "split": split,
            "index": index,
            "level": str(record.get("level", "")),
            "type": str(record.get("type", record.get("subject", ""))),
        },
    }


def main(argv: list[str] | None = None) -> None:
    conversion_main(convert, __doc__, argv)


if __name__ == "__main__":
    main()
