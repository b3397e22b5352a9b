"""verl's vLLM-worker tutorial (examples/tutorial_vllm_worker.py) trains end to end: the user's constructor, a
critic model, a reward model, and the user's own vllm.LLM following the policy after every update."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import ray

pytest.importorskip("vllm")

from verl_like.models.tiny import build_tiny_classifier, build_tiny_model  # noqa: E402
from verl_like.utils.tracking import read_metrics  # noqa: E402

_PATH = Path(__file__).resolve().parents[3] / "examples" / "tutorial_vllm_worker.py"
_SPEC = importlib.util.spec_from_file_location("tutorial_vllm_worker_example", _PATH)
tutorial = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = tutorial
_SPEC.loader.exec_module(tutorial)
ray.cloudpickle.register_pickle_by_value(tutorial)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

EMBED = "model.embed_tokens.weight"


class ProbedTutorialWorker(tutorial.VLLMActorWorker):
    """The tutorial's worker; before each generation it records how far its engine's embedding is from the actor's
    current one and from the initial one (one JSON line per rank and call, in `log_path`)."""

    log_path = ""

    def generate(self, prompts):
        from verl_like.rollout.vllm_compat import model_runner_model

        actor = dict(self.actor.engine.full_state_iterator())[EMBED].float()  # a collective: every rank generates
        engine = dict(model_runner_model(self.llm).named_parameters())[EMBED].float()[: actor.shape[0]]
        initial = self.__dict__.setdefault("_initial_embed", engine.clone())
        record = {"rank": self.rank, "vs_actor": float((engine - actor).abs().max()),
                  "vs_initial": float((engine - initial).abs().max())}
        with open(self.log_path, "a") as out:
            out.write(json.dumps(record) + "\n")
        return super().generate(prompts)


def test_tutorial_worker_trains_with_a_critic_and_reward_model_and_its_llm_follows_the_policy(ray_cluster, tmp_path):
    model = build_tiny_model(tmp_path / "policy")
    reward_model = build_tiny_classifier(tmp_path / "rm")
    ProbedTutorialWorker.log_path = str(tmp_path / "probe.jsonl")
    run = tmp_path / "run"
    tutorial.VLLMActorWorker = ProbedTutorialWorker  # main() builds the trainer with the module's worker class
    try:
        tutorial.main(str(model), critic_model=str(model), reward_model=str(reward_model), config=[
            "+trainer=ci_smoke", f"trainer.default_local_dir={run}", "reward_model.scoring_workers=0",
            "trainer.test_freq=-1", "data.max_response_length=16",
        ])
    finally:
        tutorial.VLLMActorWorker = ProbedTutorialWorker.__mro__[1]
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert "critic/vf_loss" in record and "reward/rm_score_mean" in record  # the critic and the RM ran
        assert record["response_length/mean"] > 0
    probes = [json.loads(line) for line in (tmp_path / "probe.jsonl").read_text().splitlines()]
    assert len(probes) == 4  # 2 ranks x 2 steps
    first, second = probes[:2], probes[2:]
    # Step 1 samples from the initial weights; step 2 from the policy after one update (fp16 engine, fp32 actor).
    assert all(p["vs_actor"] < 1e-3 and p["vs_initial"] == 0.0 for p in first)
    assert all(p["vs_actor"] < 1e-3 and p["vs_initial"] > 2 * p["vs_actor"] for p in second)

