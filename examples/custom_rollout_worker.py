"""A custom rollout worker: your own `vllm.LLM` behind the text-level `generate` hook, fed fresh weights each step.

    python examples/custom_rollout_worker.py            # CPU: builds a tiny model, 2 Ray workers, 2 RL steps

What a subclass of ActorRolloutWorker does here (the pattern of verl's custom-rollout tutorial):
- builds its engine in `__init__`, AFTER `super().__init__(...)`, which joins the group's torch.distributed
  world (vLLM then runs inside it; each rank gets its own single-GPU engine);
- overrides `generate(prompts: list[str]) -> list[str]`: the framework decodes the prompt batch to text, calls it,
  tokenizes the texts it returns into the response tensors; `compute_log_prob` adds `rollout_log_probs` (the
  actor's `old_log_probs`: one forward for both);
- overrides `update_rollout_weights(named_tensors)`: called on every rank after each actor update with the
  policy's full tensors. Leave it out and the worker warns loudly at start: the engine would keep the initial
  weights, and every rollout would come from a stale policy.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from verl_like.config.actor import ActorConfig, OptimConfig
from verl_like.config.rollout import RolloutConfig
from verl_like.protocol import DataProto
from verl_like.workers.actor_rollout import ActorRolloutWorker

logger = logging.getLogger(__name__)


class MyRolloutWorker(ActorRolloutWorker):
    """Generates with a `vllm.LLM` of its own (greedy or sampled as rollout.temperature says)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # first: joins the torch.distributed world that vLLM will share
        from vllm import LLM

        config = self.rollout_config
        self.llm = LLM(
            model=self.model_path,
            dtype=config.dtype,
            max_model_len=config.engine_max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            enforce_eager=True,
            distributed_executor_backend="uni",  # one engine per rank, inside this process
            seed=config.seed,
        )
        self.weight_updates = 0

    def generate(self, prompts: list[str]) -> list[str]:
        from vllm import SamplingParams

        config = self.rollout_config
        params = SamplingParams(temperature=config.temperature, max_tokens=config.response_length)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        eos = self.tokenizer.eos_token
        # vLLM's text drops the eos token; put it back on finished samples so the response ends with it.
        return [o.outputs[0].text + (eos if o.outputs[0].finish_reason == "stop" else "") for o in outputs]

    def update_rollout_weights(self, named_tensors) -> None:
        from verl_like.rollout.vllm_compat import load_full_weights

        load_full_weights(self.llm, named_tensors)  # vLLM's own loader (inside its CPU reload lifecycle)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.weight_updates += 1


def digit_reward(responses: list[str]) -> torch.Tensor:
    """A toy task: the fraction of a response's characters that are digits."""
    return torch.tensor([sum(c.isdigit() for c in text) / max(len(text), 1) for text in responses])


def group_advantages(scores: torch.Tensor, n: int, response_mask: torch.Tensor) -> torch.Tensor:
    """GRPO-style: each sample's score minus its prompt group's mean, on every response token; (rows, len)."""
    grouped = scores.view(-1, n)
    centered = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1, 1)
    return centered * response_mask


def main(
    model_dir: str | None = None, steps: int = 2, worker_cls: type = MyRolloutWorker, num_workers: int = 2
) -> dict[str, Any]:
    """Runs `steps` RL steps with `worker_cls` on a local Ray cluster; returns the group, prompts and metrics."""
    from transformers import AutoTokenizer

    from verl_like.models.tiny import build_tiny_model
    from verl_like.single_controller import ResourcePool, RoleSpec, WorkerGroup, init_ray
    from verl_like.utils.env import apply_default_env

    env = apply_default_env("cpu")
    model_dir = str(build_tiny_model(model_dir or Path(tempfile.gettempdir()) / "verl_like_tiny"))
    init_ray(num_cpus=4, env_vars=env)
    n = 2
    actor = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, optim=OptimConfig(lr=1e-2))
    rollout = RolloutConfig(dtype="float32", n=n, temperature=1.0, prompt_length=32, response_length=12)
    pool = ResourcePool.create([num_workers], device="cpu", cpus_per_process=1.0, name="custom_rollout_pool")
    group = WorkerGroup(pool, RoleSpec(worker_cls, (model_dir, actor, rollout)), name="custom_rollout")
    group.init_model()

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = ["1+2=", "3*4=", "10-7=", "2*2="]
    encoded = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    mask = encoded["attention_mask"]
    prompts = DataProto.from_dict(tensors=dict(
        input_ids=encoded["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)))
    history = []
    for step in range(steps):
        batch = group.generate_sequences(prompts)
        rollout_metrics = batch.meta_info.pop("metrics")
        old = group.compute_log_prob(batch)
        diff = old.meta_info.pop("metrics")
        batch = batch.union(old)
        responses = tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        scores = digit_reward(responses)
        batch.batch["advantages"] = group_advantages(scores, n, batch.batch["response_mask"])
        update = group.update_actor(batch).meta_info["metrics"]
        sync = group.sync_weights()[0]
        history.append({"score": float(scores.mean()), **{k: v[0] for k, v in rollout_metrics.items()},
                        **{k: v[0] for k, v in diff.items()}, "actor/pg_loss": update["actor/pg_loss"][0], **sync})
        logger.debug("step %d: %s", step, history[-1])
    return {"group": group, "pool": pool, "prompts": prompts, "history": history, "model_dir": model_dir}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    result = main(steps=args.steps)
    for step, metrics in enumerate(result["history"]):
        print(f"step {step}: score={metrics['score']:.3f} rollout tokens/s={metrics['rollout/tokens_per_s']:.0f} "
              f"sync {metrics['weight_sync/wall_s']:.3f} s ({metrics['weight_sync/model_bytes'] / 1e6:.1f} MB)")
    result["group"].close()
    result["group"].shutdown()
    result["pool"].remove()
