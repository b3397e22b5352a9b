"""examples/custom_rollout_worker.py runs on a 2-rank Ray group, and its own vLLM engine follows the actor's updates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import ray
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM  # noqa: E402

from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.hf import HFRolloutEngine  # noqa: E402
from verl_like.single_controller import Dispatch, register  # noqa: E402
from verl_like.workers.actor_rollout import ActorRolloutWorker, stale_policy_warning  # noqa: E402

_PATH = Path(__file__).resolve().parents[3] / "examples" / "custom_rollout_worker.py"
_SPEC = importlib.util.spec_from_file_location("custom_rollout_worker_example", _PATH)
example = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = example
_SPEC.loader.exec_module(example)
# Ray workers import neither the example nor this test module: ship both by value.
ray.cloudpickle.register_pickle_by_value(example)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

GREEDY_TOKENS = 8


class ProbedWorker(example.MyRolloutWorker):
    """The example's worker plus a look at its engine and a count of the actor engine's forwards."""

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        super().init_model()
        self.forward_calls = 0
        forward = self.actor.engine.forward

        def counted(*args, **kwargs):
            self.forward_calls += 1
            return forward(*args, **kwargs)

        self.actor.engine.forward = counted

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def forward_count(self) -> int:
        return self.forward_calls

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def engine_greedy(self, token_lists: list[list[int]]) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=t) for t in token_lists], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def weight_update_count(self) -> int:
        return self.weight_updates

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def full_actor_state(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.actor.engine.full_state_iterator()}


def hf_greedy(model_dir: str, state, prompts) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state)
    sampling = SamplingConfig(do_sample=False, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    return HFRolloutEngine(model).generate(prompts, sampling).batch["responses"]


def test_example_runs_and_its_engine_takes_the_new_weights(ray_cluster, tmp_path):
    result = example.main(model_dir=str(tmp_path / "tiny"), steps=1, worker_cls=ProbedWorker)
    group, prompts = result["group"], result["prompts"]
    try:
        step = result["history"][0]
        assert step["rollout/tokens_per_s"] > 0 and step["weight_sync/model_bytes"] > 0
        assert step["rollout/logprob_diff_max"] == 0.0
        assert group.weight_update_count() == [2, 2]  # init + after the update
        # One actor forward per step: compute_log_prob's old_log_probs are also the text rollout's log-probs.
        assert group.forward_count() == [1, 1]
        batch = group.generate_sequences(prompts)
        assert "rollout_log_probs" not in batch.batch.keys() and group.forward_count() == [1, 1]
        scored = group.compute_log_prob(batch)
        assert group.forward_count() == [2, 2]
        response_mask = batch.batch["response_mask"]
        assert response_mask.sum() > 0
        assert torch.equal(scored.batch["rollout_log_probs"], scored.batch["old_log_probs"] * response_mask)
        mask = prompts.batch["attention_mask"].bool()
        token_lists = [row[m].tolist() for row, m in zip(prompts.batch["input_ids"], mask)]
        engine = torch.tensor(group.engine_greedy(token_lists)[1])
        updated = hf_greedy(result["model_dir"], group.full_actor_state()[0], prompts)
        initial = hf_greedy(result["model_dir"], None, prompts)
        assert torch.equal(engine, updated)
        assert not torch.equal(engine, initial)
    finally:
        try:
            group.close()
        finally:
            group.shutdown()
            result["pool"].remove()


def test_a_text_hook_without_a_weight_hook_gets_the_stale_policy_warning():
    class TextOnly(ActorRolloutWorker):
        def generate(self, prompts):
            return prompts

    class Both(TextOnly):
        def update_rollout_weights(self, named_tensors):
            pass

    assert "STALE POLICY" in stale_policy_warning(TextOnly) and "TextOnly" in stale_policy_warning(TextOnly)
    assert stale_policy_warning(Both) is None
    assert stale_policy_warning(ActorRolloutWorker) is None
    assert stale_policy_warning(example.MyRolloutWorker) is None
