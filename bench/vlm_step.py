"""GRPO steps of a Qwen2.5-VL-shaped model (random weights) on image prompts, through main_ppo as a user runs it.

The model is built locally (models/tiny_qwen_vl.py) in one of `SHAPES`, bf16 checkpoint; the prompts are the
synthetic counting pictures (`synthetic:count`, 48 x 48 Pillow drawings, resized by the processor to
`--image-side` square), one image each, through the real Qwen2.5-VL processor (torchvision: the GPU image). The job
runs main_ppo with the `vlm_tiny` preset's settings (full-tensor weight sync, colocated in-process vLLM) on one
GPU: FSDP2 with fp32 master weights and bf16 compute, vLLM in bf16, no validation.

Printed per step (RESULT lines, as bench/gpu_suite.sh collects them): each phase's seconds (`timing_s/*`:
gen, old_log_prob, update_actor, sync_weights, step, ...) and the trainer-vs-vLLM log-prob gap on the image rows
(`rollout/image_logprob_diff_mean`, `_max`), then one summary line with the medians over the steps after the first.
The reward is the counting task's own. The random policy does not write counts, so every sample of a group scores
the same and the advantages and the gradient are 0 (actor/grad_norm 0 in the run measured): the update still runs
its full forward and backward, so its time is the real one.

    python bench/vlm_step.py                          # qwen2.5-vl-0.5b-text shape, 2 steps of 16 prompts x 4
    python bench/vlm_step.py --shape qwen2.5-vl-3b    # Qwen2.5-VL-3B's text and vision config
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# text: hidden, layers, heads, kv heads, intermediate, mrope_section; vision: depth, hidden, heads, intermediate,
# full-attention blocks (Qwen2.5-VL-3B: 32 blocks of 1280, window attention but in 4).
SHAPES = {
    "qwen2.5-vl-3b": ((2048, 36, 16, 2, 11008, (16, 24, 24)), (32, 1280, 16, 3420, (7, 15, 23, 31))),
    "qwen2.5-vl-0.5b-text": ((896, 24, 14, 2, 4864, (8, 12, 12)), (8, 1280, 16, 3420, (3, 7))),
    "tiny": ((256, 2, 4, 2, 512, (8, 12, 12)), (2, 128, 2, 256, (1,))),
}


def build(shape: str, image_side: int, workdir: Path) -> Path:
    from verl_like.models.tiny_qwen_vl import TinyQwenVLSpec, build_tiny_qwen_vl

    (hidden, layers, heads, kv, inter, mrope), (depth, v_hidden, v_heads, v_inter, full) = SHAPES[shape]
    spec = TinyQwenVLSpec(model_type="qwen2_5_vl", hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                          mrope_section=mrope, vision_depth=depth, vision_hidden_size=v_hidden, vision_heads=v_heads,
                          vision_intermediate_size=v_inter, window_size=112, fullatt_block_indexes=full,
                          image_side=image_side, max_position_embeddings=4096, torch_dtype="bfloat16")
    return build_tiny_qwen_vl(workdir / f"{shape}-{image_side}", spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-vl-0.5b-text")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--image-side", type=int, default=224, help="square pixel budget: (side/28)^2 image tokens")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--timeout-s", type=int, default=420)
    parser.add_argument("--workdir", default="/tmp/bench_models")
    parser.add_argument("--out", default=None, help="also write the records as JSON here")
    args = parser.parse_args()

    started = time.perf_counter()
    model_dir = build(args.shape, args.image_side, Path(args.workdir))
    built_s = time.perf_counter() - started
    from verl_like.data.preprocess import write_rows
    from verl_like.data.synthetic import generate_split

    run_dir = Path(tempfile.mkdtemp(prefix="vlm_step_"))
    data = write_rows(generate_split("count", "train", args.prompts * args.steps), run_dir / "count.parquet")
    image_tokens = (args.image_side // 28) ** 2
    overrides = [
        "+trainer=vlm_tiny", f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data}",
        "data.val_files=[]", "trainer.val_before_train=false", "trainer.test_freq=-1",
        f"data.max_prompt_length={image_tokens + 48}", f"data.max_response_length={args.response_len}",
        f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro_batch}",
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={args.steps}",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # the image prompts' gap is what this bench reports
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        "actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16", "trainer.ray_init.num_cpus=null",
        f"trainer.default_local_dir={run_dir}", "trainer.logger=[console,jsonl]",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    print("main_ppo", " ".join(overrides), flush=True)
    job = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "verl_like.main_ppo", *overrides], cwd=REPO, env=env,
                          timeout=args.timeout_s)
    job_s = time.perf_counter() - job
    from verl_like.utils.tracking import read_metrics

    metrics_file = run_dir / "metrics.jsonl"
    records = read_metrics(metrics_file) if metrics_file.is_file() else []
    keep = ("timing_s/", "rollout/image_logprob_diff", "rollout/logprob_diff", "rollout/tokens_per_s",
            "rollout/mean_response_length", "actor/grad_norm", "perf/")
    results = []
    for record in records:
        row = {"step": record.get("step"), **{k: v for k, v in record.items() if k.startswith(keep)}}
        results.append(row)
        print("RESULT " + json.dumps({"shape": args.shape, **row}), flush=True)
    later = results[1:] or results
    summary = {"shape": args.shape, "image_tokens": image_tokens, "prompts": args.prompts, "n": args.n,
               "response_len": args.response_len, "steps": len(results), "returncode": proc.returncode,
               "build_s": round(built_s, 1), "job_s": round(job_s, 1)}
    for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/sync_weights",
                "timing_s/step", "rollout/image_logprob_diff_mean", "rollout/image_logprob_diff_max"):
        values = [row[key] for row in later if key in row]
        if values:
            summary[f"median_{key}"] = statistics.median(values)
    print("RESULT " + json.dumps({"summary": summary}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "steps": results}, indent=2))
    if proc.returncode != 0 or len(results) < args.steps:
        sys.exit(f"main_ppo exited {proc.returncode} with {len(results)} of {args.steps} steps logged")


if __name__ == "__main__":
    main()
