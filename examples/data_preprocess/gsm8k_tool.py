"""Converts local GSM8K files into rows for the tool agent loop (the GSM8K calculator preset,
`+trainer=gsm8k_tool_agent_qwen2_5_0_5b`): the rows of `gsm8k.py` with a system message that offers the calculator
and `agent_name: tool_agent`, so each sample runs the tool loop (the chat template renders the tool's schema from
the tool config file; the model calls it in the hermes `<tool_call>` format).

    {"data_source": "openai/gsm8k", "agent_name": "tool_agent",
     "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question + instruction}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "<number>"},
     "extra_info": {"split": ..., "index": ..., "question": ..., "answer": <full solution>}}

    python examples/data_preprocess/gsm8k_tool.py --input gsm8k/train.jsonl --split train \
        --output ~/data/gsm8k_tool/train.parquet
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gsm8k  # noqa: E402  (the plain GSM8K conversion beside this file)

from verl_like.data.preprocess import conversion_main  # noqa: E402

SYSTEM = ("You are a careful math assistant. For any arithmetic, call the `calculator` tool with the expression "
          "and use its exact result; do not compute products or quotients in your head.")
AGENT_NAME = "tool_agent"


def convert(record: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One GSM8K record -> one tool-agent row."""
    row = gsm8k.convert(record, split, index)
    row["prompt"] = [{"role": "system", "content": SYSTEM}, *row["prompt"]]
    row["agent_name"] = AGENT_NAME
    return row


def main(argv: list[str] | None = None) -> None:
    conversion_main(convert, __doc__, argv)


if __name__ == "__main__":
    main()
