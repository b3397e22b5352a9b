"""RLDataset: chat template, over-long prompt policies, and the left-padded batch that collate builds."""

import dataclasses
import json
import logging

import pytest
import torch

from verl_like.config.data import DataConfig
from verl_like.data.dataset import PromptItem, RLDataset, collate
from verl_like.models.tiny import build_tokenizer
from verl_like.rollout.batch import prompt_token_lists


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def write_rows(path, prompts, data_source="synthetic/add"):
    rows = [
        {"prompt": p, "reward_model": {"ground_truth": str(i)}, "data_source": data_source, "extra_info": {"i": i}}
        for i, p in enumerate(prompts)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat(text):
    return [{"role": "user", "content": text}]


def templated_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def test_chat_template_with_generation_prompt(tmp_path, tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2=?"}]
    path = write_rows(tmp_path / "d.jsonl", [messages])
    dataset = RLDataset([path], tokenizer, DataConfig(train_files=path))
    item = dataset[0]
    assert tokenizer.decode(item.input_ids) == "<bos><|system|>be brief<eos><|user|>1+2=?<eos><|assistant|>"
    assert item.raw_prompt == messages and item.ground_truth == "0" and item.extra_info == {"i": 0}


def test_text_prompt_becomes_a_user_message(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", ["3+4=?"])
    dataset = RLDataset(path, tokenizer, DataConfig(train_files=path))
    assert dataset[0].input_ids == templated_ids(tokenizer, chat("3+4=?"))


def test_apply_chat_template_off_tokenizes_text_as_is(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", ["3+4=?"])
    dataset = RLDataset([path], tokenizer, DataConfig(train_files=path, apply_chat_template=False))
    assert dataset[0].input_ids == tokenizer.encode("3+4=?", add_special_tokens=False)


def test_config_chat_template_replaces_the_tokenizers(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", [chat("12")])
    template = "{% for m in messages %}q: {{ m['content'] }}{% endfor %}{% if add_generation_prompt %} a:{% endif %}"
    dataset = RLDataset([path], tokenizer, DataConfig(train_files=path, chat_template=template))
    assert tokenizer.decode(dataset[0].input_ids) == "q: 12 a:"


def test_tokenizer_without_chat_template_is_refused(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", ["1"])
    bare = build_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template; set data.chat_template"):
        RLDataset([path], bare, DataConfig(train_files=path))


def test_tokenizer_without_pad_token_is_refused(tmp_path):
    path = write_rows(tmp_path / "d.jsonl", ["1"])
    bare = build_tokenizer()
    bare.pad_token = None
    with pytest.raises(ValueError, match="the tokenizer has no pad token; set tokenizer.pad_token"):
        RLDataset([path], bare, DataConfig(train_files=path))


def test_filter_drops_and_counts_overlong_prompts(tmp_path, tokenizer, caplog):
    prompts = ["1", "2" * 30, "3", "4" * 40]
    path = write_rows(tmp_path / "d.jsonl", prompts)
    with caplog.at_level(logging.WARNING):
        dataset = RLDataset([path], tokenizer, DataConfig(train_files=path, max_prompt_length=12, truncation="filter"))
    assert dataset.num_filtered == 2 and len(dataset) == 2
    assert [item.ground_truth for item in dataset.items] == ["0", "2"]
    assert [item.index for item in dataset.items] == [0, 1]
    assert "filtered 2 of 4 prompts longer than data.max_prompt_length=12 tokens (longest 44)" in caplog.text


def test_filter_overlong_prompts_switch_filters_too(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", ["1", "2" * 30])
    config = DataConfig(train_files=path, max_prompt_length=12, filter_overlong_prompts=True, truncation="error")
    assert RLDataset([path], tokenizer, config).num_filtered == 1


def test_all_prompts_filtered_is_an_error(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", ["1" * 20, "2" * 30])
    with pytest.raises(ValueError, match=r"all 2 prompts are longer than data.max_prompt_length=8 .*longest 34"):
        RLDataset([path], tokenizer, DataConfig(train_files=path, max_prompt_length=8, truncation="filter"))


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncation_keeps_the_expected_tokens(tmp_path, tokenizer, side, caplog):
    text = "0123456789abcdefghij"
    path = write_rows(tmp_path / "d.jsonl", [text, "1"])
    limit = 11
    with caplog.at_level(logging.WARNING):
        dataset = RLDataset([path], tokenizer, DataConfig(train_files=path, max_prompt_length=limit, truncation=side))
    full = templated_ids(tokenizer, chat(text))
    if side == "left":
        expected = full[len(full) - limit:]
    elif side == "right":
        expected = full[:limit]
    else:
        expected = full[:5] + full[len(full) - 6:]
    assert dataset[0].input_ids == expected and dataset[0].truncated
    assert not dataset[1].truncated and dataset[1].input_ids == templated_ids(tokenizer, chat("1"))
    assert dataset.num_truncated == 1 and f"truncated 1 prompts ({side})" in caplog.text


def test_collate_left_pads_to_max_prompt_length(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", ["1", "22+3=?", chat("0")])
    dataset = RLDataset([path], tokenizer, DataConfig(train_files=path, max_prompt_length=16))
    batch = dataset.collate([dataset[1], dataset[0], dataset[2]])
    ids, mask, positions = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    assert ids.shape == mask.shape == positions.shape == (3, 16)
    for row, item in enumerate([dataset[1], dataset[0], dataset[2]]):
        pad = 16 - len(item.input_ids)
        assert ids[row].tolist() == [tokenizer.pad_token_id] * pad + item.input_ids
        assert mask[row].tolist() == [0] * pad + [1] * len(item.input_ids)
        assert positions[row].tolist() == [0] * pad + list(range(len(item.input_ids)))
    assert prompt_token_lists(batch) == [dataset[1].input_ids, dataset[0].input_ids, dataset[2].input_ids]
    columns = batch.non_tensor_batch
    assert list(columns["ground_truth"]) == ["1", "0", "2"]
    assert list(columns["data_source"]) == ["synthetic/add"] * 3
    assert "raw_prompt" not in columns  # data.return_raw_chat=false (the default)
    assert columns["extra_info"][1] == {"i": 0}
    assert columns["index"].tolist() == [1, 0, 2]
    assert len(set(columns["uid"])) == 3


@pytest.mark.parametrize("apply_chat_template", [True, False])
def test_return_raw_chat_adds_the_chat_messages(tmp_path, tokenizer, apply_chat_template):
    rows = ["22+3=?", "1"] if not apply_chat_template else ["22+3=?", chat("0")]
    path = write_rows(tmp_path / "d.jsonl", rows)
    config = DataConfig(train_files=path, max_prompt_length=16, return_raw_chat=True,
                        apply_chat_template=apply_chat_template)
    dataset = RLDataset([path], tokenizer, config)
    batch = dataset.collate([dataset[1], dataset[0]])
    raw = batch.non_tensor_batch["raw_prompt"]
    expected_first = chat("0") if apply_chat_template else [{"role": "user", "content": "1"}]
    assert list(raw) == [expected_first, [{"role": "user", "content": "22+3=?"}]]
    # The token ids do not depend on the switch.
    plain = RLDataset([path], tokenizer, dataclasses.replace(config, return_raw_chat=False))
    assert torch.equal(plain.collate([plain[1], plain[0]]).batch["input_ids"], batch.batch["input_ids"])
    # The column survives what the trainer does to a batch: repeat for rollout.n, then split across ranks.
    repeated = batch.repeat(2, interleave=True)
    assert list(repeated.non_tensor_batch["raw_prompt"]) == [expected_first, expected_first, raw[1], raw[1]]
    assert [list(part.non_tensor_batch["raw_prompt"]) for part in repeated.chunk(2)][1] == [raw[1], raw[1]]


def test_collate_rejects_empty_and_overlong_items():
    with pytest.raises(ValueError, match="no items"):
        collate([], 8, 0)
    item = PromptItem([5] * 9, "x", "1", "s", {}, index=4)
    with pytest.raises(ValueError, match="item 4 has 9 tokens, over max_prompt_length=8"):
        collate([item], 8, 0)


def test_collate_same_prompt_twice_gets_two_uids(tmp_path, tokenizer):
    path = write_rows(tmp_path / "d.jsonl", ["1"])
    dataset = RLDataset([path], tokenizer, DataConfig(train_files=path, max_prompt_length=8))
    batch = dataset.collate([dataset[0], dataset[0]])
    assert batch.non_tensor_batch["uid"][0] != batch.non_tensor_batch["uid"][1]
    assert torch.equal(batch.batch["input_ids"][0], batch.batch["input_ids"][1])


def test_several_files_are_concatenated_in_order(tmp_path, tokenizer):
    first = write_rows(tmp_path / "a.jsonl", ["1", "2"])
    second = write_rows(tmp_path / "b.jsonl", ["3"], data_source="other")
    dataset = RLDataset([first, second], tokenizer, DataConfig(train_files=(first, second)))
    assert len(dataset) == 3 and dataset[2].data_source == "other" and dataset[2].index == 2
