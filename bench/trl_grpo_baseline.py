"""TRL's GRPOTrainer on the workload of bench/step_throughput.py, for the side-by-side ratio of issue #14.

The same random-weight Qwen2.5-shaped checkpoint and byte-level tokenizer (`build_model`), the same prompts
(`write_prompts`: exactly `--prompt-len` tokens) and the same reward (`compute_score`: parity of the response text)
as our bench, imported from it. Per step: `--prompts` x `--n` completions of exactly `--response-len` tokens (vLLM's
`ignore_eos`), one optimizer step over all of them (per-device batch x gradient accumulation = prompts x n), no KL
term (beta 0, so no reference model), gradient checkpointing, bf16 autocast, vLLM colocated in the trainer's
process with CUDA graphs, lr 1e-6, transformers' sdpa attention.

TRL's configuration as issue #30 ran it, in its variants (each a flag, so that one hold can run them all):
`per_device_train_batch_size=--per-device-batch` (32) with `gradient_accumulation_steps = steps_per_generation =
prompts x n / 32` (8: one generation and one optimizer step per step), the model loaded in float32 (fp32 master
weights, TRL's default dtype when it loads a model by path) or in bfloat16 (`--model-dtype bfloat16`), and TRL's vLLM
importance-sampling correction on (its default: one more forward over the batch for the old log-probs) or off
(`--no-is-correction`: TRL then takes the old log-probs from the loss's own forward, its fastest configuration on
this workload; ours does the same by default, actor.recompute_old_log_prob auto).

Where TRL's step differs from ours (its defaults, kept so that this measures TRL as users run it):
- Attention: transformers' sdpa on padded rows; ours packs rows (varlen). All rows have the same length here.
- Old log-probs: both recompute them (one forward over the batch); TRL does because its vLLM importance-sampling
  correction is on by default.
- vLLM: TRL fixes max_num_batched_tokens at 4096 and max_num_seqs at the generation batch, and keeps the engine
  awake through the update where ours puts it to sleep (`--vllm-sleep`: TRL's `vllm_enable_sleep_mode`, level 2);
  weights go to vLLM one parameter at a time through `load_weights`.
- Loss: TRL's default `loss_type` and advantage scaling; the loss shape does not change the step's cost.
- Layer kernels: transformers' own by default; `--liger` turns on TRL's `use_liger_kernel` (Liger's RMSNorm,
  SwiGLU and RoPE kernels; TRL keeps its chunked LM head), the nearest TRL 1.16 has to our fused layers without the
  model hub its `use_kernels` route needs.

Reported: per-step wall time (median over steps 2..N; step k ends at the trainer's k-th on_step_end, step 1 starts at
its on_step_begin), completion tokens/s = prompts x n x response_len / step_s, and TRL's own profiling timers
(`profiling/Time taken: ...`, summed per step, median over the same steps) and its logged `step_time` (its
training_step calls, generation included, optimizer step not), as one `RESULT {json}` line.

On the GPU machine (from the repo root, device kit environment active). .whl/trl/ holds what the image and the kit
lack: trl 1.16.0 (supports vLLM 0.22-0.31 and transformers >= 4.56.2), datasets 5.2.0, multiprocess 0.70.19; the
image has accelerate, pyarrow, pandas, xxhash, fsspec, and the kit dill. /tmp/trl_extra goes last on the path so it
shadows nothing:

    python3 -m pip install -q --no-deps --no-index --target /tmp/trl_extra .whl/trl/*.whl
    PYTHONPATH=$PWD:$PYTHONPATH:/tmp/trl_extra python3 bench/trl_grpo_baseline.py --prompts 32 --n 8 \\
        --prompt-len 128 --response-len 512 --steps 5 --gpu-memory-utilization 0.3

or `bash bench/gpu_suite.sh trl_1gpu` (which also runs our step on the same workload). On CPU, to check the script
itself (tiny shape, transformers' generate instead of vLLM, fp32, two small steps):

    PYTHONPATH=$PWD:/tmp/trl_extra python bench/trl_grpo_baseline.py --smoke
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections import defaultdict  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from step_throughput import FIELDS, SHAPES, MemorySampler, build_model, compute_score, write_prompts  # noqa: E402

logger = logging.getLogger(__name__)


def parity_reward(completions: list[str], **kwargs) -> list[float]:
    """Our bench's reward for each completion (TRL's reward-function signature)."""
    return [compute_score(None, completion, None) for completion in completions]


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def record_trl_timers(timers: dict[int, dict[str, float]]) -> None:
    """Collect TRL's profiling timers into `timers[step][name]` (seconds, summed over the step's calls).

    TRL sends them only to wandb/mlflow/trackio; wrapping its one logging method is the least intrusive way to read
    them without those services.
    """
    from trl.extras.profiling import ProfilingContext

    original = ProfilingContext._log_metrics

    def log_metrics(context: ProfilingContext, duration: float) -> None:
        step = (context.step or 0) + 1  # global_step counts finished steps; this call belongs to the next one
        name = context.name.split(".", 1)[-1]  # drop the trainer's class name
        timers[step][name] = timers[step].get(name, 0.0) + duration
        original(context, duration)

    ProfilingContext._log_metrics = log_metrics


def make_step_clock():
    """A TrainerCallback noting when each optimizer step begins and ends, and TRL's logged metrics."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.begins: list[float] = []
            self.ends: list[float] = []
            self.logs: list[dict] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                self.logs.append(dict(logs))

    return StepClock()


def grpo_config(args: argparse.Namespace, run_dir: Path, device: str):
    """TRL's GRPOConfig for the workload; raises when the batch does not split into whole micro-batches."""
    from trl import GRPOConfig

    completions = args.prompts * args.n
    if completions % args.per_device_batch:
        raise ValueError(f"--prompts x --n = {completions} is not divisible by --per-device-batch="
                         f"{args.per_device_batch}; choose a divisor of {completions}")
    use_vllm = device == "cuda"
    return GRPOConfig(
        output_dir=str(run_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=completions // args.per_device_batch,  # one optimizer step per generation batch
        steps_per_generation=completions // args.per_device_batch,  # one generation per optimizer step
        model_init_kwargs={"dtype": args.model_dtype, "attn_implementation": args.attn},
        vllm_importance_sampling_correction=args.is_correction,
        num_generations=args.n,
        num_iterations=1,
        max_completion_length=args.response_len,
        beta=0.0,
        learning_rate=1e-6,
        gradient_checkpointing=True,
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_max_model_length=args.prompt_len + args.response_len,
        vllm_enable_sleep_mode=args.vllm_sleep,
        # Liger's Triton layer kernels (RMSNorm, SwiGLU, RoPE); TRL keeps its own fused LM head beside them
        use_liger_kernel=args.liger,
        # Every completion runs to the full length: vLLM ignores EOS; transformers' generate is held to a minimum.
        generation_kwargs={"ignore_eos": True} if use_vllm else {"min_new_tokens": args.response_len},
        temperature=1.0,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )


def summarize(clock, timers: dict[int, dict[str, float]], args: argparse.Namespace) -> dict:
    """Step seconds (step 1 from its begin, later ones end to end), medians over steps 2..N, TRL's timers."""
    if len(clock.ends) != args.steps:
        raise RuntimeError(f"the trainer ran {len(clock.ends)} optimizer steps, expected --steps={args.steps}")
    per_step = [clock.ends[0] - clock.begins[0]] + [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    in_step = [end - begin for begin, end in zip(clock.begins, clock.ends)]
    measured = list(range(1, args.steps)) or [0]  # step 1 pays for first-use costs (CUDA graphs, allocator, ...)
    step_s = statistics.median(per_step[i] for i in measured)
    names = sorted({name for step in measured for name in timers.get(step + 1, {})})
    trl_timers = {name: statistics.median(timers.get(i + 1, {}).get(name, 0.0) for i in measured) for name in names}
    step_logs = [log for log in clock.logs if "completions/min_length" in log]
    # TRL's own step_time: its training_step calls (generation and scoring included) without the optimizer step.
    trl_step_time = [log["step_time"] for log in step_logs if "step_time" in log]
    return {
        "step_s": step_s,
        "per_step_s": per_step,
        "in_step_s": in_step,  # on_step_begin -> on_step_end (without the trainer's logging between steps)
        "steps_measured": len(measured),
        "completion_tokens_per_s": args.prompts * args.n * args.response_len / step_s,
        "tokens_per_s": args.prompts * args.n * (args.prompt_len + args.response_len) / step_s,
        "trl_timers_s": trl_timers,
        "trl_step_time_s": statistics.median(trl_step_time[i] for i in measured)
        if len(trl_step_time) == args.steps else None,
        "completion_length_min": min((log["completions/min_length"] for log in step_logs), default=None),
        "completion_length_max": max((log["completions/max_length"] for log in step_logs), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="completions per prompt (TRL's num_generations)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--per-device-batch", type=int, default=32,
                        help="completions per micro-batch; gradient accumulation = prompts x n / this")
    parser.add_argument("--model-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="dtype TRL loads the policy in: float32 = fp32 master weights (TRL's default)")
    parser.add_argument("--attn", default="sdpa", help="transformers' attn_implementation of the policy")
    parser.add_argument("--no-is-correction", dest="is_correction", action="store_false",
                        help="TRL's vllm_importance_sampling_correction off (no separate old-log-prob forward)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of the GPU")
    parser.add_argument("--vllm-sleep", action="store_true", help="TRL's vllm_enable_sleep_mode (off by default)")
    parser.add_argument("--liger", action="store_true",
                        help="use_liger_kernel: Liger's layer kernels in the policy (CUDA; needs liger-kernel, "
                             "which bench/fetch_wheels.sh puts in .whl/trl)")
    parser.add_argument("--workdir", default=None, help="models and data (shared with step_throughput.py)")
    parser.add_argument("--out", default=None, help="also write the RESULT json here")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, transformers' generate, 2 steps")
    args = parser.parse_args()
    if args.smoke and args.liger:
        parser.error("--liger needs CUDA (Liger's kernels are Triton), --smoke runs on the CPU")
    if args.smoke:
        args.model, args.prompts, args.n, args.prompt_len, args.response_len = "tiny", 2, 2, 16, 8
        args.steps, args.per_device_batch = 2, 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="trl_grpo_"))
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = build_model(args.model, workdir / args.model, device)
    prompts_path = write_prompts(workdir / f"prompts_{args.prompt_len}.jsonl", args.prompts * args.steps,
                                 args.prompt_len)

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    rows = [json.loads(line) for line in prompts_path.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_lengths = {len(tokenizer(row["prompt"])["input_ids"]) for row in rows}
    if prompt_lengths != {args.prompt_len}:
        raise RuntimeError(f"prompts tokenize to {sorted(prompt_lengths)} tokens, expected {args.prompt_len}")
    timers: dict[int, dict[str, float]] = defaultdict(dict)
    record_trl_timers(timers)
    clock = make_step_clock()
    run_dir = workdir / f"trl_run_{args.model}_{int(time.time())}"
    with MemorySampler() as memory:
        start = time.perf_counter()
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=parity_reward,
            args=grpo_config(args, run_dir, device),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer_ready = time.perf_counter()
        trainer.train()
    report = {
        "bench": "trl_grpo", "model": args.model, "shape": dict(zip(FIELDS, SHAPES[args.model])), "device": device,
        "versions": {name: package_version(name) for name in ("trl", "transformers", "vllm", "torch", "accelerate",
                                                              "datasets", "pyarrow", "fsspec", "huggingface_hub")},
        "prompts": args.prompts, "n": args.n, "prompt_len": args.prompt_len, "response_len": args.response_len,
        "steps": args.steps, "per_device_batch": args.per_device_batch,
        "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
        "use_vllm": trainer.args.use_vllm, "vllm_mode": trainer.args.vllm_mode, "enforce_eager": False,
        "vllm_sleep": args.vllm_sleep, "gpu_memory_utilization": args.gpu_memory_utilization,
        "use_liger_kernel": trainer.args.use_liger_kernel,
        "master_dtype": str(next(trainer.model.parameters()).dtype), "bf16_autocast": trainer.args.bf16,
        "model_dtype": args.model_dtype, "steps_per_generation": trainer.args.steps_per_generation,
        "vllm_importance_sampling_correction": trainer.args.vllm_importance_sampling_correction,
        "attn_implementation": trainer.model.config._attn_implementation, "loss_type": trainer.args.loss_type,
        "process_start_to_trainer_s": start - PROCESS_START, "trainer_init_s": trainer_ready - start,
        "peak_memory_gib": [m / 1024 for m in memory.peak_mib],
        **summarize(clock, timers, args),
    }
    print("RESULT " + json.dumps(report), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
