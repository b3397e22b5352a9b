"""verl's vLLM actor-worker tutorial, as written there, with only its two import lines changed.

    python examples/tutorial_vllm_worker.py MODEL_DIR [CRITIC_DIR] [REWARD_MODEL_DIR]

The worker below has its own constructor (it never calls `super().__init__`) and a text-level `generate`.
verl_like sets up the ActorRolloutWorker part around it (verl_like/workers/custom_worker.py): the actor trains the
model named by `model_name`, and after every update the policy's weights go into `self.llm` by themselves.
Departures from the tutorial: its trainer lines sit in `main()` under a `__main__` guard, and `main` takes an
optional `config` (key=value overrides; the tutorial passes none and so runs the embedded default task).
"""

from vllm import LLM, SamplingParams

from verl_like.trainer import PPOTrainer  # verl: from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl_like.workers import ActorRolloutWorker  # verl: from verl.workers.fsdp_workers import ActorRolloutRefWorker


class VLLMActorWorker(ActorRolloutWorker):
    def __init__(self, model_name, tensor_parallel_size=1):
        self.llm = LLM(model=model_name, tensor_parallel_size=tensor_parallel_size, dtype="half")
        self.sampling_params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=256)

    def generate(self, prompts):
        outputs = self.llm.generate(prompts, self.sampling_params)
        return [output.outputs[0].text for output in outputs]


def main(model_name, critic_model=None, reward_model=None, config=None):
    trainer = PPOTrainer(
        config,
        actor_rollout_worker=VLLMActorWorker,
        actor_rollout_kwargs={"model_name": model_name, "tensor_parallel_size": 1},
        critic_model=critic_model,
        reward_model=reward_model,
    )
    return trainer.fit()


if __name__ == "__main__":
    import logging
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(*sys.argv[1:4])
