"""Converts local GSM8K files into verl_like's prompt format (one parquet or jsonl file per split).

Input: the files as distributed (no hub access here): the original repository's `train.jsonl` / `test.jsonl`, or
the Hugging Face parquet files (`main/train-00000-of-00001.parquet`); rows with `question` and `answer`, whose
last line is `#### <number>`. Output rows:

    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": question + instruction}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "<number>"},
     "extra_info": {"split": ..., "index": ..., "question": ..., "answer": <full solution>}}

    python examples/data_preprocess/gsm8k.py --input gsm8k/train.jsonl --split train --output data/gsm8k/train.parquet
"""

from __future__ import annotations

import re
from typing import Any

from verl_like.data.preprocess import conversion_main

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = ' Solve it step by step, then write the final answer as a number on its own line after "####".'
_FINAL = re.compile(r"####\s*(.+?)\s*$")


def final_answer(answer: str) -> str:
    """The number after the last '####' of a GSM8K solution, without thousands separators."""
    matches = _FINAL.findall(answer.strip().splitlines()[-1] if answer.strip() else "")
    if not matches:
        raise ValueError(f"GSM8K answer has no '#### <number>' final line: {answer[-80:]!r}")
    return matches[-1].replace(",", "")


def convert(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One GSM8K record -> one verl_like row."""
    for key in ("question", "answer"):
        if not isinstance(record.get(key), str):
            raise ValueError(f"GSM8K record {index} has no text field {key!r}; fields: {sorted(record)}")
    question = record["question"].strip()
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(record["answer"])},
        "extra_info": {"split": split, "index": index, "question": question, "answer": record["answer"]},
    }


def main(argv: list[str] | None = None) -> None:
    conversion_main(convert, __doc__, argv)


if __name__ == "__main__":
    main()
