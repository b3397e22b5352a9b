"""Update-phase throughput of a training engine (FSDP2, or Megatron with --strategy megatron): forward_backward +
optimizer_step on rollout-shaped batches.

Models: Qwen2.5-0.5B- and 1.5B-shaped Qwen2 models with random weights (no hub), fp32 master weights with bf16
compute and fp32 gradient reduction, packed sequences (use_remove_padding) in token-budget micro-batches.
Reports valid tokens/s, MFU against a bf16 matmul peak (default 790 TFLOP/s per GPU, as measured on our H200s)
and peak GPU memory.

FLOPs counted (model FLOPs, not hardware FLOPs): 3x the forward's matmuls, i.e. every linear layer on every
valid token, causal attention (QK^T and AV over the s(s+1)/2 pairs of each sequence) and the LM head on the
response tokens only (the engine computes logits just there). Recomputation from gradient checkpointing is not
counted.

    python bench/update_throughput.py                          # both shapes, one GPU
    torchrun --nproc-per-node 8 bench/update_throughput.py     # data parallel over 8 GPUs
    python bench/update_throughput.py --smoke                  # tiny shape on CPU, a check that it runs
    python bench/update_throughput.py --strategy megatron --tp 1 --pp 1   # Megatron-core on the same batches

Megatron runs without TransformerEngine (the local layer spec): padded micro-batches (no packed sequences) and
attention that materialises the s x s scores, so compare it with FSDP2 both packed and --padded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl_like.engine.config import EngineConfig
from verl_like.engine.fsdp import FSDPEngine
from verl_like.engine.shared import init_process_group_from_env, single_process_env
from verl_like.protocol import DataProto
from verl_like.utils.device import is_cuda_available
from verl_like.shapes.decoder import DecoderShape
from verl_like.utils.flops import training_flops


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool


SHAPES = {
    "qwen2.5-0.5b": Shape(896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": Shape(1536, 28, 12, 2, 8960, 151936, True),
    "tiny": Shape(64, 2, 4, 2, 128, 256, True),
}


def build_random_model(shape: Shape, out_dir: Path) -> Path:
    """Writes a random-weight Qwen2 model of `shape` (bf16) to `out_dir` (rank 0 only; others wait)."""
    if dist.get_rank() == 0:
        config = Qwen2Config(**asdict(shape), max_position_embeddings=32768, dtype="bfloat16")
        torch.manual_seed(0)
        device = "cuda" if is_cuda_available() else "cpu"
        with torch.device(device):
            model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(out_dir)
        del model
    dist.barrier()
    return out_dir


def make_rollout_batch(rows: int, prompt_len: int, response_len: int, vocab_size: int, seed: int) -> DataProto:
    """Rollout-shaped rows: left-padded prompts and right-padded responses, each between half and full length."""
    generator = torch.Generator().manual_seed(seed)
    seq_len = prompt_len + response_len
    input_ids = torch.randint(0, vocab_size, (rows, seq_len), generator=generator)
    attention_mask = torch.zeros(rows, seq_len, dtype=torch.long)
    prompt_valid = torch.randint(prompt_len // 2, prompt_len + 1, (rows,), generator=generator)
    response_valid = torch.randint(response_len // 2, response_len + 1, (rows,), generator=generator)
    for row in range(rows):
        attention_mask[row, prompt_len - int(prompt_valid[row]) : prompt_len + int(response_valid[row])] = 1
    tensors = {
        "input_ids": input_ids * attention_mask,
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(attention_mask.cumsum(dim=1) - 1, min=0),
        "responses": (input_ids * attention_mask)[:, prompt_len:],
        "response_mask": attention_mask[:, prompt_len:],
        "advantages": torch.randn(rows, response_len, generator=generator),
    }
    return DataProto.from_dict(tensors=tensors)


def policy_gradient_loss(outputs, micro_batch):
    """Token-mean -advantage * log-prob (the cost of PPO's clipped loss, without its bookkeeping)."""
    mask = micro_batch.batch["response_mask"].to(outputs["log_probs"].dtype)
    per_token = -outputs["log_probs"] * micro_batch.batch["advantages"]
    return (per_token * mask).sum() / micro_batch.meta_info["global_token_count"], {}


def model_flops(shape: Shape, batch: DataProto) -> float:
    """Training FLOPs (3x forward) of one update on `batch`, counted by verl_like.utils.flops (module docstring)."""
    fields = {k: v for k, v in asdict(shape).items() if k != "tie_word_embeddings"}
    fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    lengths = batch.batch["attention_mask"].sum(dim=1)
    head_tokens = int(batch.batch["response_mask"].sum())
    return training_flops(DecoderShape(**fields), lengths, head_tokens, shape.vocab_size)


def run_shape(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    shape = SHAPES[name]
    model_dir = build_random_model(shape, workdir / name)
    # Megatron's bf16 path (mixed-precision optimizer) needs CUDA; on CPU it computes in float32.
    fp32 = args.fp32 or (args.strategy == "megatron" and not is_cuda_available())
    config = EngineConfig(
        model_path=str(model_dir),
        dtype="float32",
        param_dtype=None if fp32 else "bfloat16",
        reduce_dtype="float32",
        attn_implementation=args.attn if args.strategy == "fsdp2" else None,
        gradient_checkpointing=args.gradient_checkpointing,
        fused_kernels=args.fused_kernels,
        lr=1e-6,
        use_remove_padding=not args.padded and args.strategy == "fsdp2",
        use_dynamic_bsz=True,
        max_tokens_per_rank=args.max_tokens_per_rank,
    )
    engine = build_engine(config, args)
    batches = [
        make_rollout_batch(args.rows_per_rank, args.prompt_len, args.response_len, shape.vocab_size,
                           seed=1000 * step + dist.get_rank())
        for step in range(args.warmup_steps + args.steps)
    ]
    if is_cuda_available():
        torch.cuda.reset_peak_memory_stats()
    elapsed, flops, tokens, micro_batches = 0.0, 0.0, 0, 0
    for step, batch in enumerate(batches):
        if is_cuda_available():
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        result = engine.forward_backward(batch, policy_gradient_loss)
        engine.optimizer_step()
        if is_cuda_available():
            torch.cuda.synchronize()
        dist.barrier()
        if step >= args.warmup_steps:
            elapsed += time.perf_counter() - start
            flops += model_flops(shape, batch)
            tokens += int(batch.batch["attention_mask"].sum())
            micro_batches += result.num_micro_batches
    totals = torch.tensor([flops, float(tokens)], dtype=torch.float64)
    dist.all_reduce(totals)
    world = dist.get_world_size()
    peak_memory_gib = (
        torch.cuda.max_memory_allocated() / 2**30 if is_cuda_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    )
    report = {
        "model": name,
        "gpus": world if is_cuda_available() else 0,
        "world_size": world,
        "strategy": args.strategy,
        "tp": args.tp if args.strategy == "megatron" else 1,
        "pp": args.pp if args.strategy == "megatron" else 1,
        "attn_implementation": (engine.model.config._attn_implementation if args.strategy == "fsdp2"
                                else "megatron-local"),
        "gradient_checkpointing": args.gradient_checkpointing,
        "fused_kernels": args.fused_kernels,
        "compute_dtype": "float32" if fp32 else "bfloat16",
        "packed": not args.padded,
        "fused_log_probs": os.environ.get("VERL_LIKE_FUSED_LOG_PROBS", "1") != "0",
        "chunked_head": os.environ.get("VERL_LIKE_CHUNKED_HEAD", "auto"),
        "rows_per_rank": args.rows_per_rank,
        "prompt_len": args.prompt_len,
        "response_len": args.response_len,
        "max_tokens_per_rank": args.max_tokens_per_rank,
        "micro_batches_per_step": micro_batches / args.steps,
        "timed_steps": args.steps,
        "seconds_per_step": elapsed / args.steps,
        "tokens_per_s": float(totals[1]) / elapsed,
        "tokens_per_s_per_rank": float(totals[1]) / elapsed / world,
        "tflops_per_rank": float(totals[0]) / elapsed / world / 1e12,
        "mfu": float(totals[0]) / elapsed / (world * args.peak_tflops * 1e12),
        "peak_memory_gib": peak_memory_gib,
        "peak_memory_kind": "cuda max_memory_allocated" if is_cuda_available() else "process max RSS",
    }
    if args.profile:
        report["profile"] = profile_step(engine, batches[-1], Path(args.profile) / name)
    del engine
    if is_cuda_available():
        torch.cuda.empty_cache()
    return report


_KERNEL_KINDS = (  # (kind, substrings of a CUDA kernel's lower-cased name), first match wins
    ("token_log_probs", ("token_log_probs",)),  # our Triton kernels (verl_like/engine/token_log_probs.py)
    ("attention", ("flash", "fmha", "attn")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90", "sm100")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("copy_cast", ("copy", "memcpy", "cat_", "memset", "fill")),
    ("reduction", ("reduce", "softmax", "logsumexp", "norm")),
)


def _kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in _KERNEL_KINDS if any(key in lowered for key in keys)), "elementwise_other")


def profile_step(engine, batch: DataProto, out_dir: Path) -> dict:
    """One more (untimed) update under torch.profiler: device time by kernel kind, the top kernels, and the trace.

    Writes `kernels.txt` (top 40 kernels by device time) and `trace.json.gz` to `out_dir`; returns the summary.
    """
    from torch.profiler import ProfilerActivity, profile

    out_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda_available() else [])
    if is_cuda_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        engine.forward_backward(batch, policy_gradient_loss)
        engine.optimizer_step()
        if is_cuda_available():
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    kernels = [event for event in prof.key_averages() if event.device_type.name == "CUDA"]
    by_kind: dict[str, float] = {}
    for event in kernels:
        kind = _kernel_kind(event.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + event.self_device_time_total / 1e6
    busy = sum(by_kind.values())
    top = sorted(kernels, key=lambda event: event.self_device_time_total, reverse=True)[:40]
    lines = [f"{event.self_device_time_total / 1e3:10.1f} ms {event.count:7d}x  {event.key[:160]}" for event in top]
    (out_dir / "kernels.txt").write_text("\n".join(lines) + "\n")
    prof.export_chrome_trace(str(out_dir / "trace.json.gz"))  # torch gzips by the suffix
    return {"wall_s": wall, "device_busy_s": busy, "device_s_by_kind": dict(sorted(by_kind.items())),
            "top_kernels": lines[:15]}


def build_engine(config: EngineConfig, args: argparse.Namespace):
    """The engine under test: FSDP2, or Megatron-core with the --tp/--pp layout (data parallel over the rest)."""
    if args.strategy == "fsdp2":
        return FSDPEngine(config)
    from verl_like.config.megatron import MegatronConfig
    from verl_like.engine.megatron.engine import MegatronEngine

    distributed = {"auto": is_cuda_available(), "on": True, "off": False}[args.distributed_optimizer]
    return MegatronEngine(config, MegatronConfig(tensor_model_parallel_size=args.tp,
                                                 pipeline_model_parallel_size=args.pp,
                                                 use_distributed_optimizer=distributed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=sorted(SHAPES))
    parser.add_argument("--rows-per-rank", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--response-len", type=int, default=1536)
    parser.add_argument("--max-tokens-per-rank", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--attn", default=None, choices=["flash_attention_2", "varlen", "flex_attention", "sdpa", "eager"])
    parser.add_argument("--padded", action="store_true", help="padded rows instead of packed sequences")
    parser.add_argument("--strategy", default="fsdp2", choices=["fsdp2", "megatron"])
    parser.add_argument("--tp", type=int, default=1, help="Megatron tensor-parallel size")
    parser.add_argument("--pp", type=int, default=1, help="Megatron pipeline-parallel size")
    parser.add_argument("--distributed-optimizer", default="auto", choices=["auto", "on", "off"],
                        help="Megatron's ZeRO-1 optimizer (auto: on for CUDA, as docs/benchmarks.md measured)")
    parser.add_argument("--fp32", action="store_true", help="compute in float32 (default: bf16 on CUDA)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--fused-kernels", action="store_true",
                        help="Triton RMSNorm and SwiGLU in the model (use_fused_kernels; FSDP2 on CUDA)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 matmul peak per GPU")
    parser.add_argument("--workdir", default=None, help="where the random models are written (default: a tmp dir)")
    parser.add_argument("--profile", default=None,
                        help="directory: profile one more update (kernels by kind, top kernels, a chrome trace)")
    parser.add_argument("--smoke", action="store_true", help="tiny shape, few short rows, on CPU")
    args = parser.parse_args()
    if args.smoke:
        os.environ["VERL_LIKE_FORCE_CPU"] = "1"
        args.models, args.rows_per_rank, args.prompt_len, args.response_len = ["tiny"], 8, 16, 32
        args.max_tokens_per_rank, args.steps, args.warmup_steps = 128, 2, 1
    single_process_env()  # `python bench/...` without torchrun: a one-rank group on loopback
    init_process_group_from_env()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="update_throughput_"))
    for name in args.models:
        report = run_shape(name, args, workdir)
        if dist.get_rank() == 0:
            print(
                f"{name}: {report['tokens_per_s']:,.0f} tokens/s ({report['tokens_per_s_per_rank']:,.0f} per rank), "
                f"{report['tflops_per_rank']:.1f} TFLOP/s per rank, MFU {100 * report['mfu']:.1f}% of "
                f"{args.peak_tflops:.0f}, peak memory {report['peak_memory_gib']:.1f} GiB ({report['peak_memory_kind']})",
                flush=True,
            )
            print("RESULT " + json.dumps(report), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
