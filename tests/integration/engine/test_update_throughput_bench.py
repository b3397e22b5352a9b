"""bench/update_throughput.py: its FLOP count agrees with torch's FLOP counter, and its CPU smoke run works."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_like.protocol import DataProto

BENCH = Path(__file__).resolve().parents[3] / "bench" / "update_throughput.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("update_throughput", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_model_flops_match_torch_flop_counter_up_to_the_documented_savings():
    bench = _bench_module()
    shape = bench.SHAPES["tiny"]
    seq_len, response_len = 12, 7
    config = Qwen2Config(**bench.asdict(shape), attn_implementation="eager")
    model = Qwen2ForCausalLM(config)
    batch = DataProto.from_dict(tensors={
        "attention_mask": torch.ones(1, seq_len, dtype=torch.long),
        "response_mask": torch.ones(1, response_len, dtype=torch.long),
    })
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(0, shape.vocab_size, (1, seq_len)))  # full logits, full s x s attention
    h, layers, s = shape.hidden_size, shape.num_hidden_layers, seq_len
    # The bench counts causal attention (s(s+1)/2 pairs, not s^2) and LM-head logits on response tokens only.
    attention_not_needed = layers * 2 * h * (s * s - s)
    head_not_needed = 2 * h * shape.vocab_size * (s - response_len)
    expected_forward = counter.get_total_flops() - attention_not_needed - head_not_needed
    assert bench.model_flops(shape, batch) == 3 * expected_forward


def test_cpu_smoke_run_reports_throughput(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    completed = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--workdir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    report = json.loads(lines[0].removeprefix("RESULT "))
    assert report["model"] == "tiny" and report["tokens_per_s"] > 0 and report["micro_batches_per_step"] > 1
    assert 0 < report["mfu"] < 1
