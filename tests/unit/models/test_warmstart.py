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
    demonstrations,
    sft_tensors,
    supervised_finetune,
    warmstart_dir,
)

SMALL = WarmStartSpec(task="sort", sft_examples=64, steps=20, batch_size=16, lr=3e-3)


def test_demonstrations_mix_correct_and_flawed_answers():
    rows = generate_split("sort", "sft", 2000)
    answers = demonstrations(rows, 0.25, seed=0)
    assert answers == demonstrations(rows, 0.25, seed=0)
    correct = [a == r["reward_model"]["ground_truth"] for a, r in zip(answers, rows)]
    for answer, row in zip(answers, rows):
        assert answer in (row["reward_model"]["ground_truth"], row["extra_info"]["flawed_answer"])
    differs = [r["reward_model"]["ground_truth"] != r["extra_info"]["flawed_answer"] for r in rows]
    shown = [c for c, d in zip(correct, differs) if d]  # rows where the flaw shows
    assert 0.2 < sum(shown) / len(shown) < 0.3
    assert demonstrations(rows[:50], 1.0, 0) == [r["reward_model"]["ground_truth"] for r in rows[:50]]
    assert demonstrations(rows[:50], 0.0, 0) == [r["extra_info"]["flawed_answer"] for r in rows[:50]]


def test_sft_tensors_mask_only_the_answer_and_eos():
    tokenizer = build_tokenizer()
    rows = generate_split("add", "sft", 3)
    answers = ["7", "123", "45"]
    input_ids, attention_mask, loss_mask = sft_tensors(tokenizer, rows, answers)
    with pytest.raises(ValueError, match="got 2 answers for 3 rows"):
        sft_tensors(tokenizer, rows, answers[:2])
    for i, (row, demo) in enumerate(zip(rows, answers)):
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        answer = tokenizer.encode(demo, add_special_tokens=False)
        full = prompt + answer + [tokenizer.eos_token_id]
        pad = input_ids.shape[1] - len(full)
        assert input_ids[i].tolist() == full + [tokenizer.pad_token_id] * pad
        assert attention_mask[i].tolist() == [1] * len(full) + [0] * pad
        assert loss_mask[i].tolist() == [0] * len(prompt) + [1] * (len(answer) + 1) + [0] * pad


def test_supervised_finetune_lowers_the_loss_and_reports_its_progress(tmp_path, caplog):
    from verl_like.models.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    rows = generate_split("add", "sft", 64)
    tensors = sft_tensors(AutoTokenizer.from_pretrained(base), rows, demonstrations(rows, 1.0, 0))
    with caplog.at_level("INFO", logger="verl_like.models.warmstart"):
        losses = supervised_finetune(model, *tensors, SMALL, progress_every_s=0.0)  # a line per step here
    assert len(losses) == SMALL.steps
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm start: step")]
    assert progress[0].startswith("warm start: step 1/20, loss ") and progress[-1].startswith("warm start: step 20/20")


def test_build_once_and_load(tmp_path, caplog):
    path = build_warmstart_model(tmp_path, SMALL)
    assert path == warmstart_dir(tmp_path, SMALL) and path.name.startswith("warmstart-sort-")
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
        WarmStartSpec(sft_examples=64, steps=20, batch_size=16, lr=3e-3, task="add").spec_hash(),
        WarmStartSpec(sft_examples=64, steps=20, batch_size=16, lr=3e-3, demo_accuracy=0.5).spec_hash(),
        WarmStartSpec(sft_examples=64, steps=20, batch_size=16, lr=3e-3, model=TinyModelSpec(seed=1)).spec_hash(),
    }
    assert len(hashes) == 5


def test_bad_specs():
    with pytest.raises(ValueError, match="unknown synthetic task 'mul'"):
        WarmStartSpec(task="mul")
    with pytest.raises(ValueError, match=r"WarmStartSpec.steps=0 must be >= 1"):
        WarmStartSpec(steps=0)
    with pytest.raises(ValueError, match=r"WarmStartSpec.demo_accuracy=1.5 must lie in \[0, 1\]"):
        WarmStartSpec(demo_accuracy=1.5)
    with pytest.raises(ValueError, match=r"WarmStartSpec.lr=0.0 must be > 0"):
        WarmStartSpec(lr=0.0)


def test_default_warm_start_prefers_the_flaw_but_samples_the_right_answer(tmp_path):
    """The premise of the default job: greedy held-out reward starts low, correct answers are still sampled."""
    from verl_like.config.data import DataConfig
    from verl_like.data.dataset import RLDataset
    from verl_like.data.synthetic import SyntheticSizes, resolve_data_files
    from verl_like.rewards.manager import RewardManager
    from verl_like.rollout.base import SamplingConfig
    from verl_like.rollout.hf import HFRolloutEngine

    torch.manual_seed(0)
    path = build_warmstart_model(tmp_path / "models", WarmStartSpec())
    tokenizer = AutoTokenizer.from_pretrained(path)
    files = resolve_data_files("synthetic:sort:test", tmp_path / "data", SyntheticSizes(test=128))
    test = RLDataset(files, tokenizer, DataConfig(train_files=files, max_prompt_length=24))
    prompts = test.collate([test[i] for i in range(len(test))])
    engine = HFRolloutEngine(AutoModelForCausalLM.from_pretrained(path))
    rewards = RewardManager(tokenizer, num_workers=0)
    greedy = engine.generate(prompts, SamplingConfig(do_sample=False, max_tokens=8))
    _, greedy_metrics = rewards.score(greedy)
    sampled = engine.generate(prompts, SamplingConfig(n=4, max_tokens=8, seed=0))
    _, sampled_metrics = rewards.score(sampled)
    texts = tokenizer.batch_decode(greedy.batch["responses"], skip_special_tokens=True)
    flawed = sum(text == item.extra_info["flawed_answer"] for text, item in zip(texts, test.items)) / len(test)
    assert greedy_metrics["reward/score_mean"] <= 0.3
    assert flawed >= 0.5
    assert sampled_metrics["reward/score_mean"] >= 0.05
