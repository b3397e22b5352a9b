"""trainer.log_val_generations: samples decoded from a rollout batch and written to console, JSONL and TensorBoard."""

import json
import logging

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from verl_like.models.tiny import build_tokenizer
from verl_like.protocol import DataProto
from verl_like.trainer.val_generations import TEXT_TAG, ValGenerationLogger, ValSample, decode_samples


def _rollout_batch(tokenizer) -> DataProto:
    """Two rows: left-padded prompts of 3 and 2 tokens, right-padded responses of 2 and 3 tokens."""
    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode("abc"), tokenizer.encode("xy")]
    responses = [tokenizer.encode("12"), tokenizer.encode("345")]
    input_ids = torch.full((2, 6), pad)
    attention_mask = torch.zeros(2, 6, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        input_ids[row, 3 - len(prompt) : 3] = torch.tensor(prompt)
        input_ids[row, 3 : 3 + len(response)] = torch.tensor(response)
        attention_mask[row, 3 - len(prompt) : 3 + len(response)] = 1
    return DataProto.from_dict(tensors={
        "input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, 3:],
        "response_mask": attention_mask[:, 3:],
    })


def test_decode_samples_reads_only_valid_tokens_and_stops_at_the_limit():
    tokenizer = build_tokenizer()
    samples = decode_samples(_rollout_batch(tokenizer), torch.tensor([1.0, 0.0]), tokenizer, limit=5)
    assert samples == [ValSample("abc", "12", 1.0), ValSample("xy", "345", 0.0)]
    assert decode_samples(_rollout_batch(tokenizer), torch.tensor([1.0, 0.0]), tokenizer, limit=1) == samples[:1]


def test_logger_writes_console_jsonl_and_tensorboard_text(tmp_path, caplog):
    samples = [ValSample("abc", "12", 1.0), ValSample("x|y", "3", 0.5)]
    log = ValGenerationLogger(["console", "jsonl", "tensorboard"], tmp_path)
    with caplog.at_level(logging.INFO, logger="verl_like.trainer.val_generations"):
        log.log(samples, step=0)
        log.log(samples[:1], step=10)
    log.close()
    assert "val sample 1 at step 0: score=0.5 prompt='x|y' response='3'" in caplog.text
    records = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 10]
    assert records[0]["samples"][1] == {"prompt": "x|y", "response": "3", "score": 0.5}
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors(f"{TEXT_TAG}/text_summary")  # torch's add_text stores the tag with this suffix
    assert [t.step for t in texts] == [0, 10]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert "| abc | 12 | 1 |" in table and "| x\\|y | 3 | 0.5 |" in table


def test_backends_not_listed_get_nothing(tmp_path, caplog):
    log = ValGenerationLogger(["console"], tmp_path)
    log.log([ValSample("a", "b", 1.0)], step=1)
    log.close()
    assert not (tmp_path / "val_generations.jsonl").exists() and not (tmp_path / "tensorboard").exists()
