"""Whole GRPO steps through the real trainer (Ray, FSDP2, in-process vLLM with sleep mode, the sliced weight sync).

A Qwen2.5-shaped model with random weights (bf16 checkpoint, fp32 master weights, bf16 compute), prompts of exactly
`--prompt-len` tokens, responses of exactly `--response-len` tokens (ignore_eos), `--prompts` x `--n` samples per
step, one optimizer step per RL step, no reference policy (GRPO without a KL term). The reward is a parity of the
response text, so groups have reward variance and the update does real work.

With no --max-tokens-per-gpu and no --override of use_fused_kernels the job runs verl_like's defaults: on a GPU the
fused RMSNorm/SwiGLU kernels (auto) and token budgets sized from free memory (reported as `token_budgets`).

Reported per step (the first step is warm-up and left out of the medians), per GPU:
  rollout   response tokens / generation seconds
  log-probs prompt+response tokens / old-log-prob seconds
  update    prompt+response tokens / update seconds, and MFU (model FLOPs as in bench/update_throughput.py:
            3 x the forward's matmuls + causal attention, over the update wall time, against --peak-tflops)
  sync      model bytes in bf16 / weight-sync seconds (GB/s)
  step      prompt+response tokens / step seconds (end to end, rewards and driver work included)
and each phase's share of the step, the peak device memory any GPU reached (nvidia-smi, sampled every 0.2 s), and
launch -> first rollout: seconds from `launch()` (Ray start, workers, FSDP, vLLM start, first weight sync) to the
end of the first generation (and to its start, `launch_to_first_rollout_start_s`).

    python bench/step_throughput.py --model qwen2.5-0.5b                         # one GPU
    python bench/step_throughput.py --model qwen2.5-1.5b
    python bench/step_throughput.py --model qwen2.5-7b --prompts 16 --offload-policy --sleep-level 2  # 7B, 1 GPU
    python bench/step_throughput.py --model qwen2.5-0.5b --gpus 2 --tp 2         # TP=2 on two GPUs
    python bench/step_throughput.py --smoke                                      # tiny model, 2 CPU workers
    python bench/step_throughput.py --smoke --mode server                        # rollout in a vLLM server
    python bench/step_throughput.py --model qwen2.5-0.5b --mode server            # server on the trainer's GPU
    python bench/step_throughput.py --smoke --mode server --staleness 1          # generation overlapping the update
    python bench/step_throughput.py --model qwen2.5-7b --lora-rank 32            # LoRA: adapter-only sync

With --mode server the rollout runs in vLLM servers and weights go through vLLM's weight-transfer API. On GPUs the
servers share the trainer's GPUs by default (rollout_pool.gpu_fraction = --server-gpu-fraction, 0.3: one server per
GPU next to its trainer worker, vLLM's gpu_memory_utilization = that fraction unless given); 0 gives them a pool of
their own (rollout_pool, --gpus more GPUs). On CPU (--smoke) they keep a slot of their own. With --staleness K
the asynchronous driver overlaps generation with the update, the rollout phase is the background generation time,
`rollout_wait` what the step waited for it, and `overlap_fraction` 1 - wait / generation.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936, True),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064, False),
    "tiny": (128, 2, 4, 2, 256, 512, False),
}
FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "vocab_size", "tie_word_embeddings")


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The bench's reward (custom_reward_function): parity of the response text's length."""
    return float(len(solution_str) % 2)


def build_model(name: str, out_dir: Path, device: str) -> Path:
    """A random-weight bf16 Qwen2 checkpoint of shape `name` with the tiny byte-level tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_like.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()  # byte-level, one token per character; ids past its vocabulary decode to ""
    if (out_dir / "config.json").exists():  # built by another bench (maybe without a tokenizer)
        tokenizer.save_pretrained(out_dir)
        return out_dir
    shape = dict(zip(FIELDS, SHAPES[name]))
    config = Qwen2Config(**shape, max_position_embeddings=32768, bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    del model
    tokenizer.save_pretrained(out_dir)
    if device == "cuda":
        torch.cuda.empty_cache()
    return out_dir


def write_prompts(path: Path, rows: int, prompt_len: int) -> Path:
    """`rows` text prompts of exactly `prompt_len` tokens (characters of the byte-level tokenizer)."""
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    with path.open("w") as f:
        for i in range(rows):
            text = "".join(rng.choice(alphabet) for _ in range(prompt_len))
            f.write(json.dumps({"prompt": text, "ground_truth": "0", "data_source": "bench", "extra_info": {"i": i}}))
            f.write("\n")
    return path


class MemorySampler:
    """Peak memory.used (MiB) of each GPU in CUDA_VISIBLE_DEVICES (all if unset), sampled every 0.2 s by one
    `nvidia-smi -lms` process writing to a file, read when the block ends: nothing runs in the benchmarked process
    (TRL's vLLM engine shares its interpreter, so a polling thread there would compete with its scheduler)."""

    def __init__(self) -> None:
        self.peak_mib: list[int] = []
        self.enabled = shutil.which("nvidia-smi") is not None
        self._command = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-lms", "200"]
        if os.environ.get("CUDA_VISIBLE_DEVICES"):  # only this run's GPUs (another run may share the machine)
            self._command.append(f"--id={os.environ['CUDA_VISIBLE_DEVICES']}")
        self._log = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> MemorySampler:
        if self.enabled:
            self._log = tempfile.TemporaryFile(mode="w+")
            self._process = subprocess.Popen(self._command, stdout=self._log, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._log.seek(0)
        peaks: dict[int, int] = {}
        for line in self._log:
            try:
                index, used = (int(field) for field in line.split(","))
            except ValueError:  # a line cut short by terminate()
                continue
            peaks[index] = max(peaks.get(index, 0), used)
        self._log.close()
        self.peak_mib = [peaks[index] for index in sorted(peaks)]


def update_flops(shape: dict, prompt_len: int, response_len: int, sequences: int) -> float:
    """Model FLOPs of one update over `sequences` full-length rows (verl_like.utils.flops: 3x forward)."""
    import torch

    from verl_like.shapes.decoder import DecoderShape
    from verl_like.utils.flops import training_flops

    fields = {k: v for k, v in shape.items() if k != "tie_word_embeddings"}
    fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
    lengths = torch.full((sequences,), prompt_len + response_len)
    return training_flops(DecoderShape(**fields), lengths, sequences * response_len, shape["vocab_size"])


def overrides(args: argparse.Namespace, model_dir: Path, data: Path, run_dir: Path, device: str) -> list[str]:
    tokens_per_gpu = args.max_tokens_per_gpu
    megatron = args.strategy == "megatron"
    return [
        "+trainer=default_task",  # every other key as in configs/ppo_trainer.yaml, not verl's defaults
        f"data.train_files={data}", "data.val_files=[]", "data.apply_chat_template=false",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.response_len}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.model.path={model_dir}",
        # The Megatron engine runs padded micro-batches without activation recompute (what it supports); bf16 compute
        # through Megatron's Float16Module on CUDA, float32 on CPU.
        f"actor_rollout_ref.model.use_remove_padding={str(not megatron).lower()}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={str(not (args.no_grad_ckpt or megatron)).lower()}",
        f"actor_rollout_ref.actor.strategy={args.strategy}",
        *([f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={args.megatron_tp}"] if megatron else []),
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        # Without --max-tokens-per-gpu the budgets stay null: sized from free memory on a GPU (the defaults).
        *([f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens_per_gpu}"] if tokens_per_gpu else []),
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.fsdp_config.param_dtype={'float32' if device == 'cpu' else args.param_dtype}",
        "actor_rollout_ref.actor.fsdp_config.reduce_dtype=float32",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={str(args.offload).lower()}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={str(args.offload).lower()}",
        f"actor_rollout_ref.actor.fsdp_config.offload_policy={str(args.offload_policy).lower()}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}",
        f"actor_rollout_ref.rollout.dtype={args.rollout_dtype}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.enforce_eager={str(args.eager).lower()}",
        *([f"actor_rollout_ref.rollout.sleep_level={args.sleep_level}"] if args.sleep_level else []),
        f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.ignore_eos=true",
        f"actor_rollout_ref.rollout.max_num_seqs={args.max_num_seqs}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        *([f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={2 * tokens_per_gpu}"] if tokens_per_gpu else []),
        f"actor_rollout_ref.rollout.update_weights_bucket_megabytes={args.bucket_mb}",
        f"custom_reward_function.path={Path(__file__).resolve()}", "custom_reward_function.name=compute_score",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"trainer.device={device}", f"trainer.n_gpus_per_node={args.gpus}", "trainer.nnodes=1",
        f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_freq=-1", "trainer.logger=[console,jsonl]", f"trainer.default_local_dir={run_dir}",
        "trainer.experiment_name=step_throughput",
        # On CPU (--smoke) the logical CPUs may exceed the cores: 2 workers + a vLLM server in server mode.
        f"trainer.ray_init.num_cpus={4 if device == 'cpu' else 'null'}",
        "trainer.ray_init.object_store_memory_mb=null",
        f"actor_rollout_ref.rollout.mode={args.mode}",
        *([f"rollout_pool.gpu_fraction={args.server_gpu_fraction}", f"rollout_pool.n_gpus_per_node={args.gpus}"]
          if args.mode == "server" and args.server_gpu_fraction else []),
        *(["async_training.enable=true", f"async_training.staleness={args.staleness}", "algorithm.rollout_is=true"]
          if args.staleness is not None else []),
        *(["async_training.partial_rollout=true"] if args.partial_rollout else []),
        # LoRA (docs/lora.md): adapter-only sync unless --lora-merge; alpha = 2 x rank, as is usual.
        *([f"actor_rollout_ref.model.lora_rank={args.lora_rank}",
           f"actor_rollout_ref.model.lora_alpha={2 * args.lora_rank}",
           f"actor_rollout_ref.model.lora.merge={str(args.lora_merge).lower()}"] if args.lora_rank else []),
        *args.override,
    ]


def summarize(records: list[dict], args: argparse.Namespace, shape: dict) -> dict:
    from verl_like.trainer.run_summary import MEMORY_KEYS

    steps = [r for r in records if "timing_s/step" in r]
    measured = steps[1:] or steps  # step 1 pays for first-use costs (CUDA graphs, allocator growth, ...)
    tokens = args.prompts * args.n * (args.prompt_len + args.response_len)
    generated = args.prompts * args.n * args.response_len

    def median(key: str) -> float:
        return statistics.median(r[key] for r in measured)

    phases = {"gen": "rollout", "old_log_prob": "log_probs", "update_actor": "update", "sync_weights": "weight_sync"}
    if "async/generate_s" in measured[0]:  # asynchronous: generation runs in the background, the step waits less
        phases = {**phases, "gen_wait": "rollout_wait"}
        for record in measured:
            record["timing_s/gen"] = record["async/generate_s"]
    # old_log_prob is absent where the update's own forward gave the old log-probs (recompute_old_log_prob auto)
    seconds = {label: median(f"timing_s/{key}") for key, label in phases.items() if f"timing_s/{key}" in measured[0]}
    step_s = median("timing_s/step")
    log_prob_s = seconds.get("log_probs")
    gpus = args.gpus
    # rows the update left out (actor.skip_zero_advantage_rows: zero advantage everywhere) ran no forward/backward,
    # so the update's MFU counts only the rows it trained
    skipped = [r.get("actor/skipped_row_frac", 0.0) for r in steps]
    trained_rows = round(args.prompts * args.n * (1 - statistics.median(skipped[1:] or skipped)))
    flops = update_flops(shape, args.prompt_len, args.response_len, args.prompts * args.n)
    trained_flops = update_flops(shape, args.prompt_len, args.response_len, trained_rows)
    sync_bytes = median("weight_sync/model_bytes") if "weight_sync/model_bytes" in measured[0] else float("nan")
    return {
        "step_s": step_s,
        "seconds": seconds,
        "share": {label: s / step_s for label, s in seconds.items()},
        "tokens_per_s_per_gpu": {
            "rollout": generated / seconds["rollout"] / gpus,
            "log_probs": tokens / log_prob_s / gpus if log_prob_s else None,
            "update": tokens / seconds["update"] / gpus,
            "step": tokens / step_s / gpus,
        },
        "update_mfu": trained_flops / seconds["update"] / gpus / (args.peak_tflops * 1e12),
        "log_prob_mfu": flops / 3 / log_prob_s / gpus / (args.peak_tflops * 1e12) if log_prob_s else None,
        "old_log_prob_forward": log_prob_s is not None,
        "weight_sync_gb_per_s": sync_bytes / seconds["weight_sync"] / 1e9,
        "weight_sync_gb": sync_bytes / 1e9,
        # LoRA: what each sync after the first moved (the adapter's bytes; the base went once)
        "sync_bytes": median("sync/bytes") if "sync/bytes" in measured[0] else None,
        "logprob_diff_mean": median("rollout/logprob_diff_mean") if "rollout/logprob_diff_mean" in measured[0] else None,
        "logprob_diff_max": median("rollout/logprob_diff_max") if "rollout/logprob_diff_max" in measured[0] else None,
        "overlap_fraction": median("async/overlap_fraction") if "async/overlap_fraction" in measured[0] else None,
        "skipped_row_frac": skipped,
        # the trainer process's own share of peak_memory_gib (torch's allocator, the largest worker, every step):
        # with a server on the trainer's GPU the rest of nvidia-smi's peak is the server's and the CUDA contexts'
        "trainer_memory_gib": {key.rpartition("/")[2]: max(r[key] for r in steps)
                               for key in MEMORY_KEYS if key in steps[0]},
        "steps_measured": len(measured),
        "per_step_s": [r["timing_s/step"] for r in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--gpus", type=int, default=1, help="worker processes (one per GPU)")
    parser.add_argument("--tp", type=int, default=1, help="rollout tensor-parallel size")
    parser.add_argument("--prompts", type=int, default=128, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=None,
                        help="update micro-batch token budget (log-probs: twice it); default: unset, so the config's "
                             "null budgets apply (sized from free memory on a GPU, 16384 on CPU)")
    parser.add_argument("--max-num-seqs", type=int, default=512)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="vLLM's share of device memory (default 0.5; --server-gpu-fraction when servers share)")
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--param-dtype", default="bfloat16")
    parser.add_argument("--rollout-dtype", default="bfloat16")
    parser.add_argument("--offload", action="store_true", help="actor params and optimizer offloaded to CPU")
    parser.add_argument("--offload-policy", action="store_true",
                        help="FSDP2 CPU offload (params, grads, optimizer always in CPU memory; 7B on one GPU)")
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    parser.add_argument("--sleep-level", type=int, default=None, choices=[1, 2],
                        help="actor_rollout_ref.rollout.sleep_level (default: the config's)")
    parser.add_argument("--no-grad-ckpt", action="store_true")
    parser.add_argument("--strategy", default="fsdp2", choices=["fsdp2", "megatron"], help="the actor's engine")
    parser.add_argument("--megatron-tp", type=int, default=1, help="Megatron tensor-parallel size of the actor")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 matmul peak per GPU")
    parser.add_argument("--workdir", default=None, help="models, data and run directory (kept for reruns)")
    parser.add_argument("--out", default=None, help="also write the RESULT json here")
    parser.add_argument("--mode", default="colocate", choices=["colocate", "server"],
                        help="rollout placement (server: vLLM servers on a pool of their own)")
    parser.add_argument("--staleness", type=int, default=None,
                        help="asynchronous training with this staleness K (server mode; rollout IS on)")
    parser.add_argument("--partial-rollout", action="store_true",
                        help="with --staleness: in-flight samples continue across a weight update (pause keep)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train a LoRA adapter of this rank (0: full fine-tuning); sync bytes are then the adapter's")
    parser.add_argument("--lora-merge", action="store_true", help="with --lora-rank: sync merged full weights")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="one more Hydra override of the job (repeatable), after the bench's own")
    parser.add_argument("--server-gpu-fraction", type=float, default=None,
                        help="--mode server on GPUs: each server's share of its trainer worker's GPU "
                             "(rollout_pool.gpu_fraction; default 0.3; 0: servers on GPUs of their own)")
    parser.add_argument("--smoke", action="store_true", help="tiny model on 2 CPU workers, fp32, 2 short steps")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.gpus, args.prompts, args.n, args.prompt_len, args.response_len = "tiny", 2, 4, 2, 16, 8
        args.steps, args.param_dtype, args.rollout_dtype = 2, "float32", "float32"  # budgets: the defaults
        args.max_num_seqs, args.eager = 16, True

    from verl_like.utils.device import is_cuda_available

    device = "cuda" if is_cuda_available() and not args.smoke else "cpu"
    if args.server_gpu_fraction is None:
        args.server_gpu_fraction = 0.3 if args.mode == "server" and device == "cuda" else 0.0
    if args.gpu_memory_utilization is None:
        shared = args.mode == "server" and args.server_gpu_fraction
        args.gpu_memory_utilization = args.server_gpu_fraction if shared else 0.5
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="step_throughput_"))
    workdir.mkdir(parents=True, exist_ok=True)
    shape = dict(zip(FIELDS, SHAPES[args.model]))
    model_dir = build_model(args.model, workdir / args.model, device)
    data = write_prompts(workdir / f"prompts_{args.prompt_len}.jsonl", args.prompts * args.steps, args.prompt_len)
    run_dir = workdir / f"run_{args.model}_g{args.gpus}_tp{args.tp}_{int(time.time())}"

    from verl_like.config.loader import load_config
    from verl_like.trainer import launch as launch_module
    from verl_like.trainer.ppo_trainer import PPOTrainer

    config = load_config(overrides(args, model_dir, data, run_dir, device))
    marks: dict[str, float] = {}

    class TimedTrainer(PPOTrainer):
        """Notes when the workers are up and when the first rollout has finished."""

        def init_workers(self) -> None:
            super().init_workers()
            marks["workers_ready"] = time.perf_counter()

        def _rollout(self, *a, **kw):
            marks.setdefault("first_rollout_start", time.perf_counter())
            out = super()._rollout(*a, **kw)
            marks.setdefault("first_rollout_done", time.perf_counter())
            return out

    launch_module.PPOTrainer = TimedTrainer  # launch() builds the trainer by this name
    launch_start = time.perf_counter()
    with MemorySampler() as memory:
        launch_module.launch(config)
    from verl_like.utils.tracking import read_metrics

    records = read_metrics(next(run_dir.rglob("metrics.jsonl")))
    report = {
        "model": args.model, "shape": shape, "gpus": args.gpus, "tp": args.tp, "device": device,
        "mode": args.mode, "strategy": args.strategy, "megatron_tp": args.megatron_tp, "staleness": args.staleness,
        "server_gpu_fraction": args.server_gpu_fraction,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "prompts": args.prompts, "n": args.n, "prompt_len": args.prompt_len, "response_len": args.response_len,
        "offload": args.offload, "offload_policy": args.offload_policy, "eager": args.eager,
        "rollout_dtype": args.rollout_dtype, "partial_rollout": args.partial_rollout, "overrides": args.override,
        "lora_rank": args.lora_rank, "lora_merge": args.lora_merge,
        "fused_log_probs": os.environ.get("VERL_LIKE_FUSED_LOG_PROBS", "1") != "0",
        "chunked_head": os.environ.get("VERL_LIKE_CHUNKED_HEAD", "auto"),
        # What the defaults resolved to (config/fused_kernels.py, engine/token_budget.py) or the flags set.
        "max_tokens_per_gpu": args.max_tokens_per_gpu,
        "use_fused_kernels": config.actor_rollout_ref.actor.use_fused_kernels,
        "recompute_old_log_prob": config.actor_rollout_ref.actor.recompute_old_log_prob,
        "token_budgets": {key: value for key, value in records[0].items() if key.endswith("token_budget")},
        "sleep_level": config.actor_rollout_ref.rollout.sleep_level,
        "launch_to_first_rollout_s": marks["first_rollout_done"] - launch_start,
        "launch_to_first_rollout_start_s": marks["first_rollout_start"] - launch_start,
        "launch_to_workers_ready_s": marks["workers_ready"] - launch_start,
        "process_start_to_launch_s": launch_start - PROCESS_START,
        "peak_memory_gib": [m / 1024 for m in memory.peak_mib],
        "startup": {key: value for key, value in records[0].items() if key.startswith("startup/")},
        **summarize(records, args, shape),
    }
    print("RESULT " + json.dumps(report), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
