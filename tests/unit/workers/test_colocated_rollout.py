"""The worker's rollout side without a model: the colocated component's sleep/wake staging and its part of a weight
sync, seeds per TP group, the text hook's contract; the server link refuses generation and asks no engine."""

from __future__ import annotations

import pytest
import torch

from verl_like.config.actor import ActorConfig
from verl_like.config.rollout import RolloutConfig
from verl_like.config.topology import actor_group_topology
from verl_like.protocol import DataProto
from verl_like.rollout.request import GenerationRequest
from verl_like.workers.colocated_rollout import ColocatedRolloutComponent, ServerRolloutLink


class Engine:
    """Records what the component asks of a RolloutEngine."""

    def __init__(self, discards: bool = False) -> None:
        self.calls: list[object] = []
        self.sleep_discards_weights = discards

    def wake_up(self, tags=None) -> None:
        self.calls.append(("wake", tuple(tags)))

    def sleep(self) -> None:
        self.calls.append("sleep")

    def generate(self, prompts, sampling):
        self.calls.append(("generate", sampling.seed))
        return prompts


class Transport:
    def __init__(self) -> None:
        self.forgot = 0

    def forget_engine_weights(self) -> None:
        self.forgot += 1


def component(engine, world: int = 4, tp: int = 2, rank: int = 0, **rollout) -> ColocatedRolloutComponent:
    config = RolloutConfig(tensor_model_parallel_size=tp, **rollout)
    layout = actor_group_topology(world, ActorConfig(ppo_micro_batch_size_per_gpu=1), None, config).rollout
    return ColocatedRolloutComponent(engine, config, layout, rank)


def prompts(rows: int) -> DataProto:
    batch = DataProto.from_dict({"input_ids": torch.ones(rows, 3, dtype=torch.long),
                                 "attention_mask": torch.ones(rows, 3, dtype=torch.long),
                                 "position_ids": torch.arange(3).repeat(rows, 1)})
    batch.meta_info.update(GenerationRequest(seed=100).to_meta_info())
    return batch


def test_a_discarding_sleep_makes_the_next_wake_reload_and_the_transport_forget():
    engine, transport = Engine(discards=True), Transport()
    side = component(engine)
    side.sleep()
    assert side.reloads_on_wake and engine.calls == ["sleep"]
    side.before_sync(transport)  # stage 1 of the wake-up: the weights only
    assert transport.forgot == 1 and engine.calls[-1] == ("wake", ("weights",))
    side.after_sync()
    assert not side.reloads_on_wake
    side.wake()
    assert engine.calls[-2:] == [("wake", ("weights",)), ("wake", ("kv_cache",))]  # weights before the KV cache


def test_no_sleep_without_free_cache_engine():
    engine = Engine(discards=True)
    side = component(engine, free_cache_engine=False)
    side.sleep()
    assert engine.calls == [] and not side.reloads_on_wake


def test_each_tp_group_seeds_after_the_groups_before_it():
    # world 4, TP 2: ranks 2 and 3 are DP rank 1, whose 3 prompts come after DP rank 0's 3
    assert component(Engine(), rank=0).sampling(prompts(3)).seed == 100
    assert component(Engine(), rank=3).sampling(prompts(3)).seed == 100 + 3 * 1  # n = 1


def test_a_text_hook_must_answer_one_text_per_prompt():
    class Tokenizer:
        pad_token_id = 0

        def decode(self, tokens):
            return "x"

    side = ColocatedRolloutComponent(None, RolloutConfig(), component(Engine(), tp=1).layout, 0, Tokenizer(),
                                     text_hook=lambda texts: ["only one"], owner="MyWorker")
    batch = prompts(2)
    with pytest.raises(TypeError, match="MyWorker.generate returned 1 items for 2 prompts"):
        side.generate(batch, side.sampling(batch), version=0)
    assert side.scores_text_rollouts(DataProto.from_dict({"responses": torch.ones(1, 1)}))


def test_the_server_link_refuses_generation_and_holds_no_engine():
    link = ServerRolloutLink(RolloutConfig(mode="server"))
    with pytest.raises(RuntimeError, match="mode=server generates in the vLLM servers"):
        link.sampling(prompts(1))
    assert link.engine is None and not link.reloads_on_wake and not link.scores_text_rollouts(prompts(1))
    link.before_sync(Transport())  # nothing to wake
    assert link.sync_check(None, object(), 1, lambda: 10) == {}  # a transport without server clients
