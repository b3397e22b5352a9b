"""Multi-turn demonstrations for the warm start of tool tasks (`synthetic:calc`): the same ids the tool agent loop
builds at RL time, so that the supervised model and the rollout agree token for token.

A correct demonstration calls the tool, reads its reply and answers with it; a flawed one answers at once (the
task's `flawed_answer`). The loss trains on the assistant's tokens only, never on the tool's reply.
"""

from __future__ import annotations

import json

import torch
from transformers import PreTrainedTokenizerBase

from verl_like.data.synthetic import CALC_TOOL
from verl_like.experimental.agent_loop.chat_turns import TurnTemplate, render


def tool_call_text(question: str) -> str:
    """The hermes call a correct demonstrator writes for `calc A*B`."""
    expression = question.split(" ", 1)[1]
    body = json.dumps({"name": CALC_TOOL, "arguments": {"expression": expression}})
    return f"<tool_call>{body}</tool_call>"


def demonstration_ids(tokenizer: PreTrainedTokenizerBase, row: dict, use_tool: bool,
                      turns: TurnTemplate) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one demonstration: prompt, then either call + tool reply + answer, or a direct
    (flawed) answer."""
    ids = render(tokenizer, row["prompt"], True)
    mask = [0] * len(ids)
    eos = tokenizer.eos_token_id

    def assistant(text: str) -> None:
        turn = tokenizer.encode(text, add_special_tokens=False) + [eos]
        ids.extend(turn)
        mask.extend([1] * len(turn))

    if use_tool:
        answer = row["reward_model"]["ground_truth"]
        assistant(tool_call_text(row["extra_info"]["question"]))
        inserted = turns.append([{"role": "tool", "content": answer}])
        ids.extend(inserted.ids)
        mask.extend([0] * len(inserted.ids))
        assistant(f"answer: {answer}")
    else:
        assistant(f"answer: {row['extra_info']['flawed_answer']}")
    return ids, mask


def tool_sft_tensors(tokenizer: PreTrainedTokenizerBase, rows: list[dict], use_tool: list[bool]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask`, `loss_mask` `(rows, seq_len)` of the demonstrations."""
    turns = TurnTemplate(tokenizer)
    built = [demonstration_ids(tokenizer, row, tool, turns) for row, tool in zip(rows, use_tool)]
    width = max(len(ids) for ids, _ in built)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(built):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        attention_mask[i, :len(ids)] = 1
        loss_mask[i, :len(ids)] = torch.tensor(mask)
    return input_ids, attention_mask, loss_mask
