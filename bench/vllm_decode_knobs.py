"""Where the rollout's decode time goes on one GPU (issue #30): raw `vllm.LLM.generate` on TRL's GRPO workload
(32 prompts x 8 samples, prompt 128, response 512 ignoring EOS, random Qwen2.5-0.5B weights) under engine knobs,
each in a fresh process so that one's memory and compile state do not leak into the next.

Variants (the first is what our colocated engine builds: `rollout/vllm.py:build_llm_kwargs`, in-process core):
  base           uni executor, VLLM_ENABLE_V1_MULTIPROCESSING=0, logprobs=0 (one log-prob per sampled token)
  no_logprobs    base without the sampled tokens' log-probs
  no_async       base with async_scheduling=False (0.25.1 turns it on by default for the uni executor)
  mp_core        the engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1): scheduling and output
                 processing overlap the GPU
  seqs512        max_num_seqs=512 (one scheduler step holds all 256 sequences with room; graphs up to 512)
  kv_fit         no_logprobs with the KV cache verl_like's defaults give it (rollout.kv_cache_tokens=null:
                 257 sequences of 640 tokens, rollout/kv_cache.py) instead of all of gpu_memory_utilization
  score_after    no_logprobs, then the finished sequences scored in one prompt-log-prob pass (what a server
                 could do instead of per-step log-probs for the rollout IS weights); both times reported

    python bench/vllm_decode_knobs.py [--variants base mp_core ...] [--repeats 3] [--workdir DIR]

Prints one `RESULT {...}` line per variant: generated tokens/s, seconds per generate call (median of --repeats
after one warm-up), ms per decode step (seconds / response_len) and the engine's start time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {  # name: (engine kwargs over the base's, sampled-token log-probs, engine core in its own process)
    "base": ({}, 0, False),
    "no_logprobs": ({}, None, False),
    "no_async": ({"async_scheduling": False}, 0, False),
    "mp_core": ({}, 0, True),
    "seqs512": ({"max_num_seqs": 512}, 0, False),
    "kv_fit": ({}, None, False),
    "score_after": ({}, None, False),
}


def defaults_kv_bytes(model_dir: str, max_model_len: int, gpu_memory_utilization: float) -> int:
    """The KV cache rollout.kv_cache_tokens=null gives this model (bf16, max_num_seqs 256) on this GPU."""
    import torch
    from transformers import AutoConfig

    from verl_like.config.rollout import RolloutConfig
    from verl_like.rollout.kv_cache import kv_cache_bytes, kv_cache_request

    rollout = RolloutConfig(dtype="bfloat16", prompt_length=max_model_len - 1, response_length=1,
                            gpu_memory_utilization=gpu_memory_utilization)
    request = kv_cache_request(rollout, AutoConfig.from_pretrained(model_dir), model_dir, "cuda")
    return kv_cache_bytes(request, gpu_memory_utilization, torch.cuda.get_device_properties(0).total_memory)


def score(llm, prompts, outs) -> tuple[float, int]:
    """Seconds to score every finished sequence's response tokens in one prompt-log-prob pass, and the count."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sequences = [TokensPrompt(prompt_token_ids=list(p["prompt_token_ids"]) + list(c.token_ids))
                 for p, o in zip(prompts, outs) for c in o.outputs]
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    t0 = time.perf_counter()
    scored = llm.generate(sequences, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return seconds, sum(len(o.prompt_logprobs) for o in scored)


def run_variant(args: argparse.Namespace) -> dict:
    engine_extra, logprobs, _ = VARIANTS[args.variant]
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=args.model_dir, dtype="bfloat16", gpu_memory_utilization=args.gpu_memory_utilization,
                  distributed_executor_backend="uni", max_num_seqs=256, enable_prefix_caching=False,
                  max_model_len=args.prompt_len + args.response_len, seed=0, enable_sleep_mode=True)
    kwargs.update(engine_extra)
    if args.variant == "score_after":  # vLLM scores a whole sequence as a prompt only with room for one more token
        kwargs["max_model_len"] += 1
    if args.variant == "kv_fit":
        kwargs["kv_cache_memory_bytes"] = defaults_kv_bytes(args.model_dir, args.prompt_len + args.response_len,
                                                            args.gpu_memory_utilization)
    start = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - start
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_len, min_tokens=args.response_len,
                            ignore_eos=True, logprobs=logprobs, detokenize=False, seed=1)
    prompts = [TokensPrompt(prompt_token_ids=[(i * 7 + j) % 200 + 10 for j in range(args.prompt_len)])
               for i in range(args.prompts)]
    times = []
    for _ in range(args.repeats + 1):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    generated = sum(len(c.token_ids) for o in outs for c in o.outputs)
    seconds = statistics.median(times[1:])
    extra: dict = {}
    if args.variant == "score_after":
        score_times = []
        for _ in range(args.repeats + 1):
            score_s, positions = score(llm, prompts, outs)
            score_times.append(score_s)
        extra = {"score_seconds": statistics.median(score_times[1:]), "all_score_seconds": score_times,
                 "scored_positions": positions}
    import torch

    free, total = torch.cuda.mem_get_info()
    extra.update(device_used_gib=(total - free) / 2**30, kv_cache_memory_bytes=kwargs.get("kv_cache_memory_bytes"))
    return {"variant": args.variant, "engine_kwargs": engine_extra, "logprobs": logprobs, **extra,
            "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), "generated_tokens": generated,
            "seconds": seconds, "all_seconds": times, "tokens_per_s": generated / seconds,
            "ms_per_decode_step": 1000 * seconds / args.response_len, "engine_start_s": start_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=sorted(VARIANTS))
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # one variant, in this process
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--workdir", default="/tmp/bench_models")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per variant")
    args = parser.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(run_variant(args)), flush=True)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from step_throughput import build_model

    model_dir = build_model(args.model, Path(args.workdir) / args.model, "cuda")
    for name in args.variants:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1" if VARIANTS[name][2] else "0")
        command = [sys.executable, __file__, "--variant", name, "--model-dir", str(model_dir),
                   *(f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                     ("prompts", "n", "prompt_len", "response_len", "repeats", "gpu_memory_utilization"))]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out after {args.timeout_s:.0f} s", flush=True)
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            print(f"{name}: rc={done.returncode}\n" + "\n".join(done.stderr.splitlines()[-15:]), flush=True)
            continue
        print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
