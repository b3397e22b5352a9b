"""Rollout speed of `actor_rollout_ref.rollout.name=hf` vs `vllm` on one process: generated tokens per second.

Both engines get the same prompts, sampling and lengths (ignore_eos: every sample is exactly --response-len
tokens), on the same local model. Each is timed over --repeats generate calls after one warm-up call; engine start
is reported separately. Prints one JSON line.

    python bench/rollout_hf_vs_vllm.py                         # CPU: tiny model, 32 prompts x n=2, 64 tokens
    python bench/rollout_hf_vs_vllm.py --hidden 256 --layers 4 # a larger random model of the same shape family
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.utils.env import apply_default_env


def _prompts(rows: int, prompt_len: int, vocab_size: int) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(10, vocab_size, (rows, prompt_len), generator=generator)
    mask = torch.ones_like(input_ids)
    return DataProto.from_dict(tensors=dict(input_ids=input_ids, attention_mask=mask,
                                            position_ids=torch.arange(prompt_len).expand(rows, -1).clone()))


def _timed(engine, prompts: DataProto, sampling: SamplingConfig, repeats: int) -> dict[str, float]:
    engine.generate(prompts, sampling)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, sampling)
        seconds.append(time.perf_counter() - start)
    tokens = float(out.batch["response_mask"].sum())
    median = statistics.median(seconds)
    return {"tokens_per_call": tokens, "median_s": round(median, 4), "tokens_per_s": round(tokens / median, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=None, help="hidden size of the tiny model (default: its own)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    apply_default_env(device)

    from transformers import AutoConfig, AutoModelForCausalLM

    from verl_like.models.tiny import TinyModelSpec, build_tiny_model
    from verl_like.rollout.hf import HFRolloutEngine
    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    overrides = {k: v for k, v in (("hidden_size", args.hidden), ("num_hidden_layers", args.layers)) if v}
    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / f"verl_like_bench_{args.hidden}_{args.layers}",
                                 TinyModelSpec(**overrides))
    config = AutoConfig.from_pretrained(model_dir)
    prompts = _prompts(args.rows, args.prompt_len, config.vocab_size)
    sampling = SamplingConfig(n=args.n, temperature=1.0, max_tokens=args.response_len, ignore_eos=True, seed=0)
    report = {"device": device, "threads": torch.get_num_threads(), "rows": args.rows, "n": args.n,
              "prompt_len": args.prompt_len, "response_len": args.response_len, "dtype": args.dtype,
              "params": None, "hf": {}, "vllm": {}}

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).to(device)
    report["params"] = sum(p.numel() for p in model.parameters())
    hf = HFRolloutEngine(model)
    report["hf"] = {"start_s": round(time.perf_counter() - start, 2), **_timed(hf, prompts, sampling, args.repeats)}
    del hf, model

    start = time.perf_counter()
    vllm = VLLMRolloutEngine(str(model_dir), VLLMEngineOptions(
        dtype=args.dtype, max_model_len=args.prompt_len + args.response_len, enforce_eager=True,
        max_num_seqs=args.rows * args.n))
    report["vllm"] = {"start_s": round(time.perf_counter() - start, 2), **_timed(vllm, prompts, sampling, args.repeats)}
    vllm.shutdown()
    report["vllm_over_hf"] = round(report["vllm"]["tokens_per_s"] / report["hf"]["tokens_per_s"], 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
