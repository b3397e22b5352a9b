"""An engine whose sleep throws its weights away (vLLM's sleep level 2 on GPU) gets them again before every
generation, also twice within one step (DAPO's extra batches, ReMax's greedy pass, validation).

CPU has no vLLM sleep mode, so the engine here is HF `generate` whose sleep zeroes the model's weights, which is
what a level-2 sleep leaves behind from the engine's point of view.
"""

from __future__ import annotations

import sys

import pytest
import ray
import torch
from transformers import AutoTokenizer

from verl_like.config.actor import ActorConfig
from verl_like.config.rollout import RolloutConfig
from verl_like.models.tiny import build_tiny_model
from verl_like.protocol import DataProto
from verl_like.rollout.hf import HFRolloutEngine
from verl_like.single_controller import Dispatch, ResourcePool, RoleSpec, WorkerGroup, register
from verl_like.workers.actor_rollout import ActorRolloutWorker

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class DiscardingEngine(HFRolloutEngine):
    """HF generate whose sleep leaves zeros where the weights were."""

    def sleep(self) -> None:
        with torch.no_grad():
            for param in self.model.parameters():
                param.zero_()

    @property
    def sleep_discards_weights(self) -> bool:
        return True


class DiscardingWorker(ActorRolloutWorker):
    def build_rollout_engine(self) -> DiscardingEngine:
        from transformers import AutoModelForCausalLM

        return DiscardingEngine(AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def syncs_so_far(self) -> int:
        return self.sync_count

    def _sync_weights(self) -> dict[str, float]:
        self.sync_count = getattr(self, "sync_count", 0) + 1
        return super()._sync_weights()


@pytest.fixture(scope="module")
def group(ray_cluster, tmp_path_factory):
    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("discard") / "tiny"))
    rollout = RolloutConfig(name="hf", dtype="float32", prompt_length=16, response_length=6, n=1, free_cache_engine=True)
    pool = ResourcePool.create([1], device="cpu", cpus_per_process=1.0, name="discard_test")
    worker_group = WorkerGroup(pool, RoleSpec(DiscardingWorker, (model_dir, ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2), rollout)),
                               name="discard")
    worker_group.init_model()
    yield worker_group, AutoTokenizer.from_pretrained(model_dir)
    worker_group.shutdown()
    pool.remove()


def test_weights_discarded_by_sleep_are_synced_again_before_each_generation(group):
    worker_group, tokenizer = group
    encoded = tokenizer(["1+2=?", "sort 321"], padding=True, padding_side="left", return_tensors="pt")
    mask = encoded["attention_mask"]
    prompts = DataProto.from_dict(
        tensors=dict(input_ids=encoded["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)),
        meta_info={"do_sample": False},
    )
    before = worker_group.syncs_so_far()[0]
    first = worker_group.generate_sequences(prompts).batch["responses"]
    second = worker_group.generate_sequences(prompts).batch["responses"]  # same step: no update in between
    assert torch.equal(first, second)
    # A zeroed model emits token 0 everywhere; the synced one does not.
    assert not bool((second == 0).all())
    assert worker_group.syncs_so_far()[0] == before + 2
