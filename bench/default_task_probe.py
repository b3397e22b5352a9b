"""Single-process GRPO on the embedded default task: does the held-out reward rise from the warm start?

A prototype of the default job without Ray or FSDP, to choose the task and its settings: the warm-start
checkpoint (verl_like/models/warmstart.py), prompts through RLDataset, rollouts with HF generate or the repo's
VLLMRolloutEngine (weights pushed after every update), rewards through the RewardManager, GRPO advantages and the
vanilla clipped policy loss from verl_like.algorithms, plain AdamW. Prints one line per evaluation; with --out,
writes every step's metrics to a JSONL file.

    nice -n 5 .venv/bin/python bench/default_task_probe.py --rollout vllm --out probe.jsonl

Measured (2 shared CPU cores, task sort, WarmStartSpec() defaults, lr 1e-3, 64 prompts x n=8, temperature 1,
8 response tokens, one optimizer step per RL step), held-out greedy score at steps 0 / 20 / 50 / 80:
HF rollout seed 0: 0.06 / 0.63 / 0.96 / 0.97; seed 1 (warm start seed 1): 0.07 / 0.63 / 0.91 / 0.96;
vLLM rollout seed 0: 0.06 / 0.65 / 0.63 / 0.88; seed 3: 0.06 / 0.85 / 0.93 / 0.96 (0.84 s per step);
32 prompts x 8, vLLM: 0.06 / 0.58 / 0.71 / 0.88 (0.41 s per step). Four optimizer steps per RL step at the same
lr oscillated (0.74 -> 0.48 -> 0.67); lr 5e-4 plateaued near 0.7; lr 2e-3 and above collapsed on `add`.

Deviation from the default job: the actor update runs in this process (no FSDP, no Ray), and the reference
policy / KL terms are off (the default job uses neither).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

for _key, _value in {
    "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TORCHDYNAMO_DISABLE": "1",
    "VLLM_HOST_IP": "127.0.0.1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from verl_like.algorithms import (  # noqa: E402
    AdvantageConfig,
    AdvantageInputs,
    LossNormalizer,
    PolicyLossConfig,
    PolicyLossInputs,
    compute_advantage,
    compute_policy_loss,
)
from verl_like.config.data import DataConfig  # noqa: E402
from verl_like.data.dataset import RLDataset  # noqa: E402
from verl_like.data.synthetic import DEFAULT_TASK, SyntheticSizes, resolve_data_files  # noqa: E402
from verl_like.models.warmstart import WarmStartSpec, build_warmstart_model  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rewards.manager import RewardManager  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.hf import HFRolloutEngine  # noqa: E402

logger = logging.getLogger("default_task_probe")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default=DEFAULT_TASK)
    p.add_argument("--warmstart-steps", type=int, default=WarmStartSpec().steps)
    p.add_argument("--warmstart-lr", type=float, default=WarmStartSpec().lr)
    p.add_argument("--demo-accuracy", type=float, default=WarmStartSpec().demo_accuracy)
    p.add_argument("--warmstart-seed", type=int, default=WarmStartSpec().seed)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=64, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="responses per prompt (rollout.n)")
    p.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per RL step (train/ppo_mini_batch)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-response-length", type=int, default=8)
    p.add_argument("--loss-agg-mode", default="token-mean")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=256)
    p.add_argument("--rollout", choices=("hf", "vllm"), default="hf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/verl_like"))
    p.add_argument("--out", default=None, help="JSONL file for per-step metrics")
    return p.parse_args()


def make_rollout(args: argparse.Namespace, model_dir: Path, model: torch.nn.Module):
    if args.rollout == "hf":
        return HFRolloutEngine(model)
    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    return VLLMRolloutEngine(model_dir, VLLMEngineOptions(seed=args.seed, enable_prefix_caching=False))


def sequence_log_probs(model: torch.nn.Module, batch: DataProto, temperature: float) -> torch.Tensor:
    """Log-probs `(rows, response_len)` of the response tokens under `model` at `temperature`."""
    input_ids, attention_mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    position_ids = batch.batch["position_ids"]
    width = batch.batch["responses"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits[:, -width - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)


def evaluate(rollout, rewards: RewardManager, prompts: DataProto, max_tokens: int) -> dict[str, float]:
    greedy = SamplingConfig(n=1, do_sample=False, max_tokens=max_tokens)
    _, metrics = rewards.score(rollout.generate(prompts, greedy))
    return {"val/greedy_score": metrics["reward/score_mean"]}


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    cache = Path(args.cache_dir)
    spec = WarmStartSpec(task=args.task, steps=args.warmstart_steps, lr=args.warmstart_lr,
                         demo_accuracy=args.demo_accuracy, seed=args.warmstart_seed)
    model_dir = build_warmstart_model(cache / "models", spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()

    data_config = DataConfig(train_files=f"synthetic:{args.task}", max_prompt_length=24)
    files = resolve_data_files(f"synthetic:{args.task}", cache / "data", SyntheticSizes())
    train = RLDataset(files, tokenizer, data_config)
    test = RLDataset(resolve_data_files(f"synthetic:{args.task}:test", cache / "data"), tokenizer, data_config)
    val_prompts = test.collate([test[i] for i in range(min(args.eval_size, len(test)))])
    rewards = RewardManager(tokenizer, num_workers=0)
    rollout = make_rollout(args, model_dir, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sampling = SamplingConfig(n=args.n, temperature=args.temperature, max_tokens=args.max_response_length,
                              seed=args.seed)
    out = open(args.out, "w") if args.out else None
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    history, recent_train_scores = [], []
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            record = {"step": step, "time_s": round(time.perf_counter() - start, 1),
                      **evaluate(rollout, rewards, val_prompts, args.max_response_length)}
            model.train()
            history.append(record)
            train_mean = float(np.mean(recent_train_scores)) if recent_train_scores else float("nan")
            recent_train_scores = []
            logger.info("step %4d  t=%6.1fs  held-out greedy=%.3f  train sampled (since last eval)=%.3f",
                        step, record["time_s"], record["val/greedy_score"], train_mean)
            if out:
                out.write(json.dumps(record) + "\n")
                out.flush()
        if step == args.steps:
            break
        prompts = train.collate([train[int(i)] for i in rng.integers(0, len(train), args.batch_size)])
        sampling = dataclasses.replace(sampling, seed=args.seed * 100_003 + step)
        batch = rollout.generate(prompts, sampling)
        token_level_scores, reward_metrics = rewards.score(batch)
        mask = batch.batch["response_mask"].bool()
        advantages, _ = compute_advantage(
            "grpo", AdvantageInputs(token_level_scores, mask, index=batch.non_tensor_batch["uid"]),
            AdvantageConfig(),
        )
        with torch.no_grad():
            old_log_probs = sequence_log_probs(model, batch, args.temperature)
        order = torch.randperm(len(batch))
        metrics = {}
        for chunk in order.chunk(args.mini_batches):
            mini = batch[chunk]
            normalizer = LossNormalizer.for_mini_batch(mask[chunk], args.loss_agg_mode, dp_group=None)
            log_probs = sequence_log_probs(model, mini, args.temperature)
            loss, metrics = compute_policy_loss(
                "vanilla", PolicyLossInputs(old_log_probs[chunk], log_probs, advantages[chunk], mask[chunk]),
                normalizer=normalizer, config=PolicyLossConfig(),
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        if args.rollout == "vllm":
            rollout.load_weights((name, p.detach()) for name, p in model.named_parameters())
        record = {"step": step + 1, "train/score_mean": round(reward_metrics["reward/score_mean"], 4),
                  "response_length": round(float(mask.sum(-1).float().mean()), 2),
                  "pg_loss": round(float(metrics.get("pg_loss", 0.0)), 5)}
        history.append(record)
        recent_train_scores.append(record["train/score_mean"])
        if out:
            out.write(json.dumps(record) + "\n")
    wall = time.perf_counter() - start
    evals = [h for h in history if "val/greedy_score" in h]
    logger.info("settings: %s", json.dumps(vars(args)))
    logger.info("held-out greedy score %.3f -> %.3f (best %.3f) in %d steps, %.0f s",
                evals[0]["val/greedy_score"], evals[-1]["val/greedy_score"],
                max(e["val/greedy_score"] for e in evals), args.steps, wall)
    if out:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
