"""HF export: the directory loads with transformers and gives the engine's own log-probs / values."""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from engine_reference import TEMPERATURE, make_batch, reference_outputs
from engine_scenarios import ROWS


def _gathered(results, kind, key):
    return torch.cat([result[kind]["outputs"][key] for result in results])


def test_exported_causal_lm_loads_and_reproduces_the_engine_log_probs(engine_runs, vocab_size, tied_model_dir):
    results = engine_runs.get("export")
    directory = Path(results[0]["causal_lm"]["directory"])
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(directory).double()
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    original = AutoModelForCausalLM.from_pretrained(tied_model_dir)
    assert not torch.equal(original.model.embed_tokens.weight, model.model.embed_tokens.weight.float())
    with torch.no_grad():
        expected = reference_outputs(model, "causal_lm", make_batch(ROWS, vocab_size, seed=0), TEMPERATURE)
    torch.testing.assert_close(_gathered(results, "causal_lm", "log_probs"), expected["log_probs"].float(),
                               atol=1e-5, rtol=1e-5)


def test_exported_tokenizer_round_trips(engine_runs, tied_model_dir):
    directory = engine_runs.get("export")[0]["causal_lm"]["directory"]
    exported, original = AutoTokenizer.from_pretrained(directory), AutoTokenizer.from_pretrained(tied_model_dir)
    text = "12 + 3 = 15"
    assert exported.encode(text) == original.encode(text)
    assert exported.decode(exported.encode(text, add_special_tokens=False)) == text


def test_exported_value_model_loads_and_reproduces_the_engine_values(engine_runs, vocab_size):
    results = engine_runs.get("export")
    directory = Path(results[0]["value"]["directory"])
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["Qwen2ForTokenClassification"]
    assert not (directory / "tokenizer.json").exists()
    model = AutoModelForTokenClassification.from_pretrained(directory).double()
    with torch.no_grad():
        expected = reference_outputs(model, "value", make_batch(ROWS, vocab_size, seed=0))
    torch.testing.assert_close(_gathered(results, "value", "values"), expected["values"].float(), atol=1e-5,
                               rtol=1e-5)
