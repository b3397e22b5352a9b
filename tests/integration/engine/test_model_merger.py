"""`python -m verl_like.model_merger` turns an FSDP training checkpoint (2 ranks) into a HF directory whose model
gives the trained engine's log-probs / values; both command shapes (ours and verl's `merge --backend fsdp`) work."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from engine_reference import TEMPERATURE, make_batch, reference_outputs
from engine_scenarios import ROWS
from verl_like.model_merger import main, parse_args


def _gathered(results, kind, key):
    return torch.cat([result[kind]["outputs"][key] for result in results])


def test_merged_policy_checkpoint_gives_the_trained_log_probs_and_round_trips_text(engine_runs, vocab_size, tmp_path):
    results = engine_runs.get("export")
    checkpoint = results[0]["causal_lm"]["checkpoint"]
    assert (Path(checkpoint) / "huggingface" / "config.json").is_file()
    target = tmp_path / "merged"
    main(["merge", "--backend", "fsdp", "--local_dir", checkpoint, "--target_dir", str(target)])
    assert (target / "model.safetensors").is_file()
    assert json.loads((target / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(target).double()
    with torch.no_grad():
        expected = reference_outputs(model, "causal_lm", make_batch(ROWS, vocab_size, seed=0), TEMPERATURE)
    torch.testing.assert_close(_gathered(results, "causal_lm", "log_probs"), expected["log_probs"].float(),
                               atol=1e-5, rtol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer.decode(tokenizer.encode("12 + 3 = 15", add_special_tokens=False)) == "12 + 3 = 15"


def test_merged_critic_checkpoint_gives_the_trained_values(engine_runs, vocab_size, tmp_path):
    results = engine_runs.get("export")
    target = tmp_path / "critic"
    main(["--local_dir", results[0]["value"]["checkpoint"], "--target_dir", str(target)])
    model = AutoModelForTokenClassification.from_pretrained(target).double()
    with torch.no_grad():
        expected = reference_outputs(model, "value", make_batch(ROWS, vocab_size, seed=0))
    torch.testing.assert_close(_gathered(results, "value", "values"), expected["values"].float(), atol=1e-5,
                               rtol=1e-5)


def test_merger_names_what_is_missing_and_refuses_other_backends(tiny_model_dir, tmp_path):
    with pytest.raises(SystemExit, match="no config.json; pass --hf_model_path"):
        main(["--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="not an FSDP checkpoint"):
        main(["--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out"), "--hf_model_path", tiny_model_dir])
    with pytest.raises(SystemExit):
        parse_args(["merge", "--backend", "megatron", "--local_dir", "a", "--target_dir", "b"])
