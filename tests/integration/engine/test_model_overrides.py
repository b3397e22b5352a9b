"""EngineConfig.override_config and trust_remote_code reach the HF model load_model builds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_hf_config, load_model, resolved_overrides

_CONFIG_CODE = '''
from transformers import Qwen2Config


class TinyCustomConfig(Qwen2Config):
    model_type = "tiny_custom"
'''

_MODELING_CODE = '''
from transformers import Qwen2ForCausalLM

from .configuration_tiny_custom import TinyCustomConfig


class TinyCustomForCausalLM(Qwen2ForCausalLM):
    config_class = TinyCustomConfig
'''


def write_remote_code_model(tiny_model_dir: str, out: Path) -> Path:
    """A copy of the tiny model whose config and model classes live in the directory (needs trust_remote_code)."""
    shutil.copytree(tiny_model_dir, out)
    (out / "configuration_tiny_custom.py").write_text(_CONFIG_CODE)
    (out / "modeling_tiny_custom.py").write_text(_MODELING_CODE)
    config = json.loads((out / "config.json").read_text())
    config["model_type"] = "tiny_custom"
    config["architectures"] = ["TinyCustomForCausalLM"]
    config["auto_map"] = {
        "AutoConfig": "configuration_tiny_custom.TinyCustomConfig",
        "AutoModelForCausalLM": "modeling_tiny_custom.TinyCustomForCausalLM",
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def remote_code_dir(tiny_model_dir, tmp_path_factory) -> str:
    return str(write_remote_code_model(tiny_model_dir, tmp_path_factory.mktemp("remote_code") / "tiny_custom"))


def test_overrides_reach_the_model_config_and_the_rotary_frequencies(tiny_model_dir):
    overrides = {"max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 500000.0}}
    model = load_model(EngineConfig(model_path=tiny_model_dir, override_config=overrides))
    assert model.config.max_position_embeddings == 4096
    # The mapping merges into rope_parameters: rope_type stays.
    assert model.config.rope_parameters == {"rope_theta": 500000.0, "rope_type": "default"}
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    expected = [1.0 / 500000.0 ** (2 * i / head_dim) for i in range(head_dim // 2)]
    inv_freq = model.model.rotary_emb.inv_freq.double().tolist()
    assert inv_freq == pytest.approx(expected, rel=1e-6)
    baseline = load_model(EngineConfig(model_path=tiny_model_dir))
    assert baseline.config.max_position_embeddings != 4096
    assert not torch.allclose(baseline.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)


def test_overrides_apply_to_value_models(tiny_model_dir):
    overrides = {"max_position_embeddings": 999}
    config = EngineConfig(model_path=tiny_model_dir, model_kind="value", override_config=overrides)
    assert load_model(config).config.max_position_embeddings == 999


def test_override_config_is_frozen_sorted_pairs_and_survives_replace(tiny_model_dir):
    import dataclasses

    config = EngineConfig(model_path=tiny_model_dir, override_config={"b": 1, "a": 2})
    assert config.override_config == (("a", 2), ("b", 1)) and config.overrides == {"a": 2, "b": 1}
    assert dataclasses.replace(config, seed=3).override_config == config.override_config
    with pytest.raises(ValueError, match="override_config has the key 3"):
        EngineConfig(model_path=tiny_model_dir, override_config={3: 1})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"foo": 1}, "EngineConfig.override_config.foo: Qwen2Config has no field 'foo'"),
        ({"max_position_embedding": 8}, "did you mean max_position_embeddings"),
        ({"rope_theta": 5e5}, "set EngineConfig.override_config.rope_parameters.rope_theta instead"),
        ({"attention_dropout": 0.1},
         "EngineConfig.override_config.attention_dropout=0.1: the engine trains with dropout off"),
    ],
)
def test_bad_overrides_name_the_key(tiny_model_dir, overrides, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_model(EngineConfig(model_path=tiny_model_dir, override_config=overrides))


def test_zero_dropout_override_is_accepted(tiny_model_dir):
    model = load_model(EngineConfig(model_path=tiny_model_dir, override_config={"attention_dropout": 0.0}))
    assert model.config.attention_dropout == 0.0


def test_resolved_overrides_hold_merged_dict_fields(tiny_model_dir):
    overrides = {"rope_parameters": {"rope_theta": 1234.0}, "max_position_embeddings": 77}
    hf_config = load_hf_config(tiny_model_dir, override_config=overrides, key="x")
    assert resolved_overrides(hf_config, overrides) == {
        "rope_parameters": {"rope_theta": 1234.0, "rope_type": "default"},
        "max_position_embeddings": 77,
    }


def test_remote_code_model_needs_trust_remote_code(remote_code_dir):
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_model(EngineConfig(model_path=remote_code_dir))
    model = load_model(EngineConfig(model_path=remote_code_dir, trust_remote_code=True))
    assert type(model).__name__ == "TinyCustomForCausalLM"
    assert type(model.config).__name__ == "TinyCustomConfig"


def test_trust_remote_code_still_loads_a_builtin_architecture(tiny_model_dir):
    plain = load_model(EngineConfig(model_path=tiny_model_dir))
    trusted = load_model(EngineConfig(model_path=tiny_model_dir, trust_remote_code=True))
    assert type(trusted) is type(plain)
    for (name, a), (_, b) in zip(plain.named_parameters(), trusted.named_parameters()):
        assert torch.equal(a, b), name
