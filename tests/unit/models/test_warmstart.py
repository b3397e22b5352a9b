"""Warm start: supervised data masks, the fine-tune lowers the loss, and the checkpoint is built once and loads."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_like.data.synthetic import generate_split
from verl_like.models.tiny import TinyModelSpec, build_tokenizer
from verl_like.models.warmstart import (
    WarmStartSpec,
    build_warmstart_model,
    sft_tensors,
    supervised_finetune,
    warmstart_dir,
)

SMALL = WarmStartSpec(sft_examples=64, steps=20, batch_size=16, lr=3e-3)


def test_sft_tensors_mask_only_the_answer_and_eos():
    tokenizer = build_tokenizer()
    rows = generate_split("add", "sft", 3)
    input_ids, attention_mask, loss_mask = sft_tensors(tokenizer, rows)
    for i, row in enumerate(rows):
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        answer = tokenizer.encode(row["reward_model"]["ground_truth"], add_special_tokens=False)
        full = prompt + answer + [tokenizer.eos_token_id]
        pad = input_ids.shape[1] - len(full)
        assert input_ids[i].tolist() == full + [tokenizer.pad_token_id] * pad
        assert attention_mask[i].tolist() == [1] * len(full) + [0] * pad
        assert loss_mask[i].tolist() == [0] * len(prompt) + [1] * (len(answer) + 1) + [0] * pad


def test_supervised_finetune_lowers_the_loss(tmp_path):
    from verl_like.models.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tensors = sft_tensors(AutoTokenizer.from_pretrained(base), generate_split("add", "sft", 64))
    losses = supervised_finetune(model, *tensors, SMALL)
    assert len(losses) == SMALL.steps
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_build_once_and_load(tmp_path, caplog):
    path = build_warmstart_model(tmp_path, SMALL)
    assert path == warmstart_dir(tmp_path, SMALL) and path.name.startswith("warmstart-add-")
    written = (path / "model.safetensors").stat().st_mtime_ns
    assert build_warmstart_model(tmp_path, SMALL) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == written
    assert json.loads((path / "verl_like_warmstart_spec.json").read_text())["hash"] == SMALL.spec_hash()
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.decode(tokenizer.encode("12+3=?", add_special_tokens=False)) == "12+3=?"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.hidden_size == SMALL.model.hidden_size
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no staging folder left behind


def test_spec_hash_covers_every_field():
    hashes = {
        SMALL.spec_hash(),
        WarmStartSpec(sft_examples=64, steps=21, batch_size=16, lr=3e-3).spec_hash(),
        WarmStartSpec(sft_examples=64, steps=20, batch_size=16, lr=3e-3, task="sort").spec_hash(),
        WarmStartSpec(sft_examples=64, steps=20, batch_size=16, lr=3e-3, model=TinyModelSpec(seed=1)).spec_hash(),
    }
    assert len(hashes) == 4


def test_bad_specs():
    with pytest.raises(ValueError, match="unknown synthetic task 'mul'"):
        WarmStartSpec(task="mul")
    with pytest.raises(ValueError, match=r"WarmStartSpec.steps=0 must be >= 1"):
        WarmStartSpec(steps=0)
    with pytest.raises(ValueError, match=r"WarmStartSpec.lr=0.0 must be > 0"):
        WarmStartSpec(lr=0.0)
