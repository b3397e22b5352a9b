"""Rollout benchmarks (issue 5 a, d): tokens/s of the rollout path vs raw `vllm.LLM.generate`; the log-prob gap.

(a) On one engine, same prompts, lengths and sampling (ignore_eos, so both produce exactly batch x n x
    response_len tokens), alternating the two so that drift hits both: raw `LLM.generate(TokensPrompt...)` vs
    `VLLMRolloutEngine.generate(DataProto)`, which is what `ActorRolloutWorker.generate_sequences` runs on each TP
    group (the worker adds only Ray's transfer of the DataProto, measured by bench/protocol_serialization.py).
    Goal: ratio >= 0.97.
(d) The trainer-vs-rollout log-prob gap in the production dtypes: the FSDP actor (fp32 master weights, bf16
    compute) is synced into vLLM (bf16) with the sliced sync, vLLM samples, and the actor recomputes the sampled
    tokens' log-probs: mean and max |rollout - actor| over response tokens (`rollout/logprob_diff_*`).

    python bench/rollout_throughput.py                                   # one GPU, Qwen2.5-0.5B shape
    torchrun --nproc-per-node 2 bench/rollout_throughput.py --tp 2       # TP=2 on two GPUs
    python bench/rollout_throughput.py --smoke                           # tiny model on CPU, a check that it runs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig

from verl_like.engine.config import EngineConfig
from verl_like.engine.fsdp import FSDPEngine
from verl_like.engine.shared import init_process_group_from_env
from verl_like.protocol import DataProto
from verl_like.shapes.decoder import DecoderShape
from verl_like.resharding.transports.colocated_sliced import SlicedWeightSync, new_sync_group
from verl_like.rollout.base import SamplingConfig
from verl_like.utils.device import is_cuda_available
from verl_like.utils.env import apply_default_env


def _weight_sync_bench():
    """bench/weight_sync.py as a module (its model shapes, random checkpoints and process-group setup)."""
    path = Path(__file__).with_name("weight_sync.py")
    spec = importlib.util.spec_from_file_location("weight_sync_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def prompt_batch(rows: int, prompt_len: int, vocab_size: int, seed: int) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(10, vocab_size, (rows, prompt_len), generator=generator)
    mask = torch.ones_like(input_ids)
    return DataProto.from_dict(tensors=dict(input_ids=input_ids, attention_mask=mask,
                                            position_ids=torch.arange(prompt_len).expand(rows, -1).clone()))


def throughput(rollout, prompts: DataProto, sampling: SamplingConfig, repeats: int) -> dict:
    """(a): tokens/s of raw LLM.generate and of the engine's generate, alternating, median over repeats."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_like.rollout import vllm_compat

    requests = [TokensPrompt(prompt_token_ids=row.tolist()) for row in prompts.batch["input_ids"]]
    common = dict(n=sampling.n, temperature=sampling.temperature, max_tokens=sampling.max_tokens, ignore_eos=True,
                  logprobs=0, detokenize=False)
    # The baseline asks for what the engine asks for, in the same (flat, where the release has it) log-prob layout;
    # vLLM's default layout (a dict and a Logprob object per token) is timed too.
    params = SamplingParams(**common, **vllm_compat.flat_logprobs_kwargs())
    dict_params = SamplingParams(**common)
    expected = len(prompts) * sampling.n * sampling.max_tokens
    raw, raw_dict, ours = [], [], []
    for _ in range(repeats + 1):  # the first round warms both up and is dropped
        for timings, request_params in ((raw, params), (raw_dict, dict_params)):
            dist.barrier()
            start = time.perf_counter()
            outputs = rollout.llm.generate(requests, request_params, use_tqdm=False)
            timings.append(time.perf_counter() - start)
            assert sum(len(s.token_ids) for o in outputs for s in o.outputs) == expected
        dist.barrier()
        start = time.perf_counter()
        out = rollout.generate(prompts, sampling)
        ours.append(time.perf_counter() - start)
        assert int(out.batch["response_mask"].sum()) == expected
    raw_tps, our_tps = expected / statistics.median(raw[1:]), expected / statistics.median(ours[1:])
    return {"raw_tokens_per_s": raw_tps, "rollout_tokens_per_s": our_tps, "ratio": our_tps / raw_tps,
            "raw_dict_logprobs_tokens_per_s": expected / statistics.median(raw_dict[1:]),
            "flat_logprobs": bool(vllm_compat.flat_logprobs_kwargs()), "tokens_per_call": expected}


def log_prob_gap(engine: FSDPEngine, rollout, prompts: DataProto, sampling: SamplingConfig) -> dict:
    """(d): mean and max |vLLM's sampled-token log-prob - the actor's| over response tokens."""
    out = rollout.generate(prompts, sampling)
    actor = engine.forward(out, temperature=sampling.temperature).batch["log_probs"]
    mask = out.batch["response_mask"].bool()
    diff = (out.batch["rollout_log_probs"] - actor).abs()[mask]
    return {"logprob_diff_mean": float(diff.mean()), "logprob_diff_max": float(diff.max()),
            "tokens": int(mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench = _weight_sync_bench()
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(bench.SHAPES))
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--rows", type=int, default=64, help="prompts per call (per TP group)")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--enforce-eager", action="store_true", help="skip CUDA graphs (faster start, slower decode)")
    parser.add_argument("--workdir", default=None, help="where the random models are written (kept for reruns)")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, fp32, short rows")
    args = parser.parse_args()
    param_dtype, rollout_dtype = "bfloat16", "bfloat16"
    if args.smoke:
        os.environ["VERL_LIKE_FORCE_CPU"] = "1"
        args.model, args.rows, args.n, args.prompt_len, args.response_len, args.repeats = "tiny", 4, 2, 8, 8, 1
        args.enforce_eager = True  # torch.compile is off on CPU (TORCHDYNAMO_DISABLE)
        param_dtype, rollout_dtype = None, "float32"
    apply_default_env("cuda" if is_cuda_available() else "cpu")
    bench._init_single_process_group()
    init_process_group_from_env()
    rank = dist.get_rank()
    shared = [args.workdir or (tempfile.mkdtemp(prefix="rollout_throughput_") if rank == 0 else None)]
    dist.broadcast_object_list(shared, src=0)
    model_dir = bench.build_random_model(bench.SHAPES[args.model], Path(shared[0]) / args.model)

    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    engine = FSDPEngine(EngineConfig(model_path=str(model_dir), dtype="float32", param_dtype=param_dtype,
                                     micro_batch_size_per_rank=8))
    rollout = VLLMRolloutEngine(str(model_dir), VLLMEngineOptions(
        tensor_parallel_size=args.tp, dtype=rollout_dtype, load_format="dummy", enforce_eager=args.enforce_eager,
        max_model_len=args.prompt_len + args.response_len, gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=max(args.rows * args.n, 1)))
    shape = DecoderShape.from_hf_config(AutoConfig.from_pretrained(model_dir))
    SlicedWeightSync(engine, rollout, shape, 512 << 20, 600.0, new_sync_group(600.0))()
    # Every TP group gets its own prompts (a different seed per group), as the worker's DP dispatch would.
    group_index = rank // args.tp
    prompts = prompt_batch(args.rows, args.prompt_len, shape.vocab_size, seed=group_index)
    sampling = SamplingConfig(n=args.n, temperature=args.temperature, max_tokens=args.response_len, ignore_eos=True)
    report = {"model": args.model, "tp": args.tp, "world_size": dist.get_world_size(), "rows": args.rows,
              "n": args.n, "prompt_len": args.prompt_len, "response_len": args.response_len,
              "rollout_dtype": rollout_dtype, "actor_compute_dtype": param_dtype or "float32",
              "throughput": throughput(rollout, prompts, sampling, args.repeats),
              "logprob_gap": log_prob_gap(engine, rollout, prompts, sampling)}
    rollout.shutdown()
    if rank == 0:
        t, g = report["throughput"], report["logprob_gap"]
        print(f"{args.model} tp={args.tp}: raw {t['raw_tokens_per_s']:,.0f} tok/s, rollout path "
              f"{t['rollout_tokens_per_s']:,.0f} tok/s (ratio {t['ratio']:.3f}); log-prob |diff| mean "
              f"{g['logprob_diff_mean']:.3g} max {g['logprob_diff_max']:.3g} over {g['tokens']} tokens", flush=True)
        print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
