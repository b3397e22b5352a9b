"""trainer.rollout_data_dir: the records of a scored rollout batch, and their atomic <step>.jsonl file."""

import json

import numpy as np
import pytest
import torch

from verl_like.config.errors import ConfigError
from verl_like.config.trainer import TrainerConfig
from verl_like.models.tiny import build_tokenizer
from verl_like.protocol import DataProto
from verl_like.trainer.rollout_dump import dump_rollouts, rollout_records, write_records


def _scored_batch(tokenizer) -> DataProto:
    """Two samples of prompt "abc" (one group) and one of "xy": left-padded prompts (3 slots), right-padded
    responses (4 slots) that end in the eos token, token-level scores on the last valid token."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts = [tokenizer.encode("abc"), tokenizer.encode("abc"), tokenizer.encode("xy")]
    responses = [tokenizer.encode("12") + [eos], tokenizer.encode("3") + [eos], tokenizer.encode("456") + [eos]]
    input_ids = torch.full((3, 7), pad)
    attention_mask = torch.zeros(3, 7, dtype=torch.long)
    scores = torch.zeros(3, 4)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        input_ids[row, 3 - len(prompt) : 3] = torch.tensor(prompt)
        input_ids[row, 3 : 3 + len(response)] = torch.tensor(response)
        attention_mask[row, 3 - len(prompt) : 3 + len(response)] = 1
        scores[row, len(response) - 1] = [1.0, 0.0, 0.5][row]
    ground_truth = np.empty(3, dtype=object)
    ground_truth[:] = ["12", "12", np.array(["456", "465"])]  # parquet hands list answers over as arrays
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, 3:],
                 "response_mask": attention_mask[:, 3:], "token_level_scores": scores},
        non_tensors={"index": np.array([7, 7, 2]), "uid": np.array(["g0", "g0", "g1"], dtype=object),
                     "ground_truth": ground_truth, "data_source": np.array(["sort"] * 3, dtype=object)},
    )


def test_records_hold_row_text_score_and_version_without_special_tokens():
    tokenizer = build_tokenizer()
    records = rollout_records(_scored_batch(tokenizer), tokenizer, step=3, weight_version=1)
    assert [(r["index"], r["uid"], r["input"], r["output"], r["score"]) for r in records] == [
        (7, "g0", "abc", "12", 1.0), (7, "g0", "abc", "3", 0.0), (2, "g1", "xy", "456", 0.5)]
    assert all(r["step"] == 3 and r["weight_version"] == 1 and r["data_source"] == "sort" for r in records)
    assert records[0]["ground_truth"] == "12"


def test_records_leave_out_a_version_nobody_recorded_and_absent_columns():
    tokenizer = build_tokenizer()
    batch = _scored_batch(tokenizer)
    del batch.non_tensor_batch["ground_truth"]
    records = rollout_records(batch, tokenizer, step=1, weight_version=None)
    assert "weight_version" not in records[0] and "ground_truth" not in records[0]


def test_dump_writes_one_json_line_per_sample_and_a_rerun_replaces_the_file(tmp_path):
    tokenizer = build_tokenizer()
    batch = _scored_batch(tokenizer)
    path = dump_rollouts(tmp_path / "dumps", batch, tokenizer, step=2, weight_version=0)
    assert path == tmp_path / "dumps" / "2.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["index"] for r in lines] == [7, 7, 2]
    assert lines[2]["ground_truth"] == ["456", "465"]
    dump_rollouts(tmp_path / "dumps", batch[[2]], tokenizer, step=2, weight_version=1)  # the resumed run's step 2
    assert [json.loads(line)["weight_version"] for line in path.read_text().splitlines()] == [1]
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["2.jsonl"]


def test_a_write_that_fails_midway_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "1.jsonl"
    write_records(path, [{"step": 1, "index": 0}])
    with pytest.raises(TypeError):
        write_records(path, [{"step": 1, "index": 5}, {(1, 2): "keys must be strings"}])
    assert path.read_text() == '{"step": 1, "index": 0}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["1.jsonl"]  # no temporary file left behind


@pytest.mark.parametrize("value", [5, ""])
def test_config_refuses_a_rollout_data_dir_that_is_not_a_path(value):
    with pytest.raises(ConfigError, match="trainer.rollout_data_dir="):
        TrainerConfig(rollout_data_dir=value)
