"""What LoRA saves on the trainer: resident memory of the reference and of one optimizer step, full vs LoRA.

Each variant runs in a fresh process (one-rank gloo world, FSDP2 on CPU, fp32): the actor engine is built, then
the reference (full: a second, inference-only engine; LoRA: the actor with its adapter disabled, nothing built),
then one forward/backward + AdamW step; the resident set size (RSS) grows by what each part holds.

    python bench/lora_memory.py                          # a ~50M-parameter Qwen2 shape
    python bench/lora_memory.py --hidden 896 --layers 24 # Qwen2.5-0.5B's trunk (tiny vocabulary)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(model_dir: str, lora_rank: int) -> dict[str, float]:
    from verl_like.engine.config import EngineConfig, LoraSettings
    from verl_like.engine.fsdp import FSDPEngine
    from verl_like.engine.from_config import reference_engine_config
    from transformers import AutoConfig

    from verl_like.rollout.sync_check import probe_batch, probe_token_ids

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29637")
    lora = LoraSettings(rank=lora_rank, alpha=2 * lora_rank) if lora_rank else None
    config = EngineConfig(model_path=model_dir, lr=1e-4, lora=lora)
    start = _rss()
    actor = FSDPEngine(config)
    after_actor = _rss()
    ref = None if lora else FSDPEngine(reference_engine_config(config))  # LoRA: the actor, adapter disabled
    after_ref = _rss()
    batch = probe_batch(probe_token_ids(AutoConfig.from_pretrained(model_dir).vocab_size, 64), start=8)
    actor.forward_backward(batch, lambda out, mb: (-out["log_probs"].mean(), {}))
    actor.optimizer_step()
    after_step = _rss()
    trainable = sum(p.numel() for p in actor.model.parameters() if p.requires_grad)
    del ref
    return {"lora_rank": lora_rank, "trainable_params": trainable,
            "actor_mb": (after_actor - start) / 2**20, "reference_mb": (after_ref - after_actor) / 2**20,
            "grads_and_adamw_mb": (after_step - after_ref) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--variant", type=int, default=None, help=argparse.SUPPRESS)  # child: the rank to measure
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant is not None:
        print("RESULT " + json.dumps(measure(args.model_dir, args.variant)))
        return
    from verl_like.models.tiny import TinyModelSpec, build_tiny_model

    with tempfile.TemporaryDirectory() as scratch:
        heads = args.hidden // 64
        spec = TinyModelSpec(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2), intermediate_size=args.hidden * 3)
        model_dir = str(build_tiny_model(os.path.join(scratch, "model"), spec))
        rows = []
        for rank in (0, args.lora_rank):
            done = subprocess.run([sys.executable, __file__, "--variant", str(rank), "--model-dir", model_dir],
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"the variant lora_rank={rank} failed:\n{done.stderr[-3000:]}")
            out = done.stdout
            rows.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    print("| variant | trainable params | actor MB | reference MB | grads + AdamW MB (one step) |")
    print("|---|---|---|---|---|")
    for row in rows:
        name = f"LoRA r={row['lora_rank']}" if row["lora_rank"] else "full"
        print(f"| {name} | {row['trainable_params']:,} | {row['actor_mb']:.0f} | {row['reference_mb']:.0f} | "
              f"{row['grads_and_adamw_mb']:.0f} |")


if __name__ == "__main__":
    main()
