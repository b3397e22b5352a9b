"""The tiny local model: tokenizer round-trips through every loader, ids are consistent, builds are idempotent."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from verl_like.models.tiny import (
    ALPHABET,
    TinyModelSpec,
    build_tiny_model,
    build_tokenizer,
    check_encodable,
)

TEXT = "what is 12 + 3 * (4 - 1)? answer: 21. x=y, z"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1=?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_tokenizer_is_one_token_per_character_and_round_trips():
    tokenizer = build_tokenizer()
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(ids) == len(TEXT)
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.decode(tokenizer.encode(ALPHABET, add_special_tokens=False)) == ALPHABET
    assert len(set(tokenizer.encode(ALPHABET, add_special_tokens=False))) == len(ALPHABET)


def test_special_token_ids_are_fixed():
    tokenizer = build_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0, 1, 2, 3,
    )
    assert tokenizer.convert_tokens_to_ids(["<|system|>", "<|user|>", "<|assistant|>"]) == [4, 5, 6]
    assert tokenizer.padding_side == "left"


def test_auto_tokenizer_round_trips_and_matches_build_tokenizer(model_dir):
    built = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(model_dir)
    ids = loaded.encode(TEXT, add_special_tokens=False)
    assert ids == built.encode(TEXT, add_special_tokens=False)
    assert loaded.decode(ids) == TEXT
    assert len(loaded) == len(built)
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 2 and loaded.bos_token_id == 1


def test_chat_template_renders_turns_and_generation_prompt(model_dir):
    loaded = AutoTokenizer.from_pretrained(model_dir)
    text = loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><|system|>be brief<eos><|user|>1+1=?<eos><|assistant|>"
    ids = loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0] == 1 and ids[-1] == 6
    assert ids.count(2) == 2
    assert loaded.decode(ids, skip_special_tokens=True) == "be brief1+1=?"
    without_prompt = loaded.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    assert not without_prompt.endswith("<|assistant|>")


def test_chat_template_rejects_unknown_role():
    with pytest.raises(Exception, match="role must be system, user or assistant"):
        build_tokenizer().apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_check_encodable_names_bad_characters():
    check_encodable(TEXT)
    with pytest.raises(ValueError, match=r"\['A', 'é'\]"):
        check_encodable("Aé1")


def test_config_generation_config_and_tokenizer_agree(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    generation = GenerationConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert config.model_type == "qwen2"
    assert config.vocab_size == len(tokenizer)
    for source in (config, generation):
        assert source.eos_token_id == tokenizer.eos_token_id
        assert source.pad_token_id == tokenizer.pad_token_id
        assert source.bos_token_id == tokenizer.bos_token_id


def test_model_matches_spec_and_is_deterministic(model_dir, tmp_path):
    spec = TinyModelSpec()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.hidden_size == spec.hidden_size
    assert model.config.num_hidden_layers == spec.num_hidden_layers
    assert model.config.num_key_value_heads == spec.num_key_value_heads
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    again = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "again"))
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    other_seed = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "seed1", TinyModelSpec(seed=1)))
    assert not torch.equal(model.lm_head.weight, other_seed.lm_head.weight)


def test_tied_and_bf16_specs(tmp_path):
    spec = TinyModelSpec(tie_word_embeddings=True, torch_dtype="bfloat16", num_hidden_layers=1)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "tied", spec), dtype="auto")
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 1


def test_build_is_idempotent_and_rebuilds_on_spec_change(model_dir):
    weights = model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_tiny_model(model_dir) == model_dir
    assert weights.stat().st_mtime_ns == mtime
    build_tiny_model(model_dir, TinyModelSpec(intermediate_size=96))
    assert AutoConfig.from_pretrained(model_dir).intermediate_size == 96
    assert AutoConfig.from_pretrained(model_dir).intermediate_size != TinyModelSpec().intermediate_size
    build_tiny_model(model_dir)
    assert AutoConfig.from_pretrained(model_dir).intermediate_size == TinyModelSpec().intermediate_size
    assert json.loads((model_dir / "verl_like_tiny_spec.json").read_text())["hash"] == TinyModelSpec().spec_hash()


def test_build_refuses_foreign_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="did not write"):
        build_tiny_model(tmp_path)


def test_invalid_spec_names_the_field():
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        TinyModelSpec(num_key_value_heads=3)
    with pytest.raises(ValueError, match="head_dim=16"):
        TinyModelSpec(hidden_size=64, num_attention_heads=4)
    with pytest.raises(ValueError, match="torch_dtype='int8'"):
        TinyModelSpec(torch_dtype="int8")


def test_vllm_tokenizer_loader_round_trips(model_dir):
    pytest.importorskip("vllm")
    from verl_like.rollout.vllm_compat import load_vllm_tokenizer

    tokenizer = load_vllm_tokenizer(str(model_dir))
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert ids == build_tokenizer().encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
