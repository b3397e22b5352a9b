"""Hybrid-engine benchmarks (issue 5 b, c): weight-sync wall time and effective GB/s; vLLM sleep/wake cost.

Every rank holds the FSDP2 actor (random weights of a real model's shape, fp32 master weights by default) and an
in-process vLLM engine (bf16, `load_format="dummy"`, TP over `--tp` consecutive ranks). Measured per model:
  sliced: `SlicedWeightSync` (each rank receives only its TP slices, bucketed, loaded in place);
  full:   `full_weight_sync` (full tensors gathered per parameter, through vLLM's own loader; the reference);
  GB/s = model bytes in the rollout dtype (bf16) / wall seconds, the issue's definition;
  sleep/wake (CUDA only): seconds of `sleep()`, `wake_up(["weights"])`, `wake_up(["kv_cache"])` and the device
  memory `sleep()` frees (torch.cuda.mem_get_info before/after).
After each sync the bench checks that vLLM's prompt log-probs of a fixed batch equal the FSDP model's (bf16
tolerance), so a fast but wrong sync cannot pass unnoticed.

    python bench/weight_sync.py                                    # one GPU, 0.5B- and 7B-shaped models
    torchrun --nproc-per-node 2 bench/weight_sync.py --tp 2        # TP=2 on two GPUs
    python bench/weight_sync.py --smoke                            # tiny model on CPU, a check that it runs
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
from verl_like.shapes.decoder import DecoderShape
from verl_like.resharding.transports.colocated_sliced import SlicedWeightSync, new_sync_group
from verl_like.resharding.transports.full import full_weight_sync
from verl_like.utils.device import is_cuda_available
from verl_like.utils.env import apply_default_env


def _load_bench(file_name: str, module_name: str):
    """A sibling bench script as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).with_name(file_name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


_update_bench = _load_bench("update_throughput.py", "update_throughput_bench")
Shape = _update_bench.Shape
SHAPES = {
    **_update_bench.SHAPES,
    "qwen2.5-7b": Shape(3584, 28, 28, 4, 18944, 152064, False),
    "tiny": Shape(128, 2, 4, 2, 256, 512, False),  # head_dim 32: vLLM's CPU attention needs it
}
_init_single_process_group = _update_bench._init_single_process_group


def build_random_model(shape: Shape, out_dir: Path) -> Path:
    """A random-weight bf16 Qwen2 checkpoint of `shape` plus a tokenizer vLLM can load (kept for reruns)."""
    built = [(out_dir / "config.json").exists()]
    dist.broadcast_object_list(built, src=0)  # rank 0 decides, so every rank takes the same branch
    if not built[0]:
        _update_bench.build_random_model(shape, out_dir)
        if dist.get_rank() == 0:
            from verl_like.models.tiny import build_tokenizer

            build_tokenizer().save_pretrained(out_dir)
        dist.barrier()
    return out_dir


def check_log_probs(engine: FSDPEngine, rollout, vocab_size: int, tolerance: float) -> float:
    """Max |vLLM - FSDP| prompt log-prob over a fixed batch; raises above `tolerance`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(10, vocab_size, (4, 24), generator=generator)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outputs = rollout.llm.generate([TokensPrompt(prompt_token_ids=t.tolist()) for t in tokens], params,
                                   use_tqdm=False)
    ours = torch.tensor([[step[t].logprob for t, step in zip(row.tolist()[1:], out.prompt_logprobs[1:])]
                         for row, out in zip(tokens, outputs)])
    with torch.no_grad():
        logits = engine.model(input_ids=tokens.to(engine.device)).logits.float().cpu()
    reference = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    worst = float((ours - reference).abs().max())
    if worst > tolerance:
        raise RuntimeError(f"vLLM's log-probs differ from the FSDP model's by {worst:.3g} after the sync")
    return worst


def timed(fn, repeats: int) -> tuple[list[float], object]:
    seconds, result = [], None
    for _ in range(repeats):
        if is_cuda_available():
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        result = fn()
        if is_cuda_available():
            torch.cuda.synchronize()
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    return seconds, result


def sleep_wake(rollout) -> dict:
    """Seconds of each sleep/wake stage and the device memory sleep frees (CUDA only)."""
    if not is_cuda_available():
        return {}
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    start = time.perf_counter()
    rollout.sleep()
    torch.cuda.synchronize()
    sleep_s = time.perf_counter() - start
    free_asleep, _ = torch.cuda.mem_get_info()
    start = time.perf_counter()
    rollout.wake_up(["weights"])
    torch.cuda.synchronize()
    wake_weights_s = time.perf_counter() - start
    start = time.perf_counter()
    rollout.wake_up(["kv_cache"])
    torch.cuda.synchronize()
    return {"sleep_s": sleep_s, "wake_weights_s": wake_weights_s, "wake_kv_cache_s": time.perf_counter() - start,
            "freed_gib": (free_asleep - free_before) / 2**30}


def run_model(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    model_dir = build_random_model(SHAPES[name], workdir / name)
    engine = FSDPEngine(EngineConfig(model_path=str(model_dir), dtype=args.train_dtype, lr=1e-6))
    options = VLLMEngineOptions(
        tensor_parallel_size=args.tp, dtype=args.rollout_dtype, load_format="dummy", max_model_len=256,
        gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=True,
    )
    rollout = VLLMRolloutEngine(str(model_dir), options)
    shape = DecoderShape.from_hf_config(AutoConfig.from_pretrained(model_dir))
    sliced = SlicedWeightSync(engine, rollout, shape, args.bucket_mb << 20, args.timeout_s,
                              new_sync_group(args.timeout_s))
    # bf16 rounding over a deep random-weight model moves log-probs by ~0.1 (0.14 seen for the 7B shape); a
    # missing or garbled sync moves them by several nats.
    tolerance = 0.5 if args.rollout_dtype == "bfloat16" else 1e-3
    report = {"model": name, "world_size": dist.get_world_size(), "tp": args.tp, "bucket_mb": args.bucket_mb,
              "train_dtype": args.train_dtype, "rollout_dtype": args.rollout_dtype,
              "gpus": dist.get_world_size() if is_cuda_available() else 0}
    for mode, fn in (("sliced", sliced), ("full", lambda: full_weight_sync(engine, rollout))):
        seconds, stats = timed(fn, args.warmup + args.repeats)
        seconds = seconds[args.warmup:]
        wall = statistics.median(seconds)
        model_bytes = sliced.plan.model_bytes  # in the rollout dtype, each tied weight once
        report[mode] = {"median_s": wall, "all_s": seconds, "gb_per_s": model_bytes / wall / 1e9,
                        "model_gb": model_bytes / 1e9, "received_gb_rank0": stats.received_bytes / 1e9,
                        "logprob_max_abs_diff": check_log_probs(engine, rollout, shape.vocab_size, tolerance)}
    report["sleep_wake"] = sleep_wake(rollout)
    rollout.shutdown()  # also ends the default process group (vLLM's in-process shutdown)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(SHAPES),
                        help="one model per run (vLLM's in-process shutdown ends the process group)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--train-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--workdir", default=None, help="where the random models are written (kept for reruns)")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, fp32, two short repeats")
    args = parser.parse_args()
    if args.smoke:
        os.environ["VERL_LIKE_FORCE_CPU"] = "1"
        args.model, args.train_dtype, args.rollout_dtype, args.repeats, args.bucket_mb = "tiny", "float32", \
            "float32", 2, 1
    apply_default_env("cuda" if is_cuda_available() else "cpu")
    _init_single_process_group()
    init_process_group_from_env()
    rank = dist.get_rank()
    shared = [args.workdir or (tempfile.mkdtemp(prefix="weight_sync_") if rank == 0 else None)]
    dist.broadcast_object_list(shared, src=0)  # one folder for every rank
    workdir = Path(shared[0])
    report = run_model(args.model, args, workdir)
    if rank == 0:
        for mode in ("sliced", "full"):
            r = report[mode]
            print(f"{args.model} tp={args.tp} {mode}: {r['median_s']:.3f} s, {r['gb_per_s']:.3g} GB/s "
                  f"({r['model_gb']:.2f} GB), log-prob max |diff| {r['logprob_max_abs_diff']:.2g}", flush=True)
        if report["sleep_wake"]:
            print(f"sleep/wake: {report['sleep_wake']}", flush=True)
        print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
