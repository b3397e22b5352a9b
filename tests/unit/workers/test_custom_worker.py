"""Which user worker classes the framework adapts, refuses or takes as they are; what PPOTrainer's verl-style
arguments mean as config overrides."""

from __future__ import annotations

import pytest

from verl_like.trainer.api import programmatic_overrides, resolve_trainer_config
from verl_like.workers import ActorRolloutWorker
from verl_like.workers.custom_worker import adapt_worker_class, model_named_by, push_weights_to_held_llms


class TutorialWorker(ActorRolloutWorker):
    def __init__(self, model_name, tensor_parallel_size=1):
        self.model_name = model_name

    def generate(self, prompts):
        return prompts


class ClassicWorker(ActorRolloutWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

    def generate(self, prompts):
        return prompts

    def update_rollout_weights(self, named_tensors):
        pass


def test_a_tutorial_worker_gets_the_base_setup_then_its_own_constructor_and_weight_pushes():
    adapted = adapt_worker_class(TutorialWorker)
    assert issubclass(adapted, TutorialWorker) and adapted.__name__ == "TutorialWorker"
    assert adapted.update_rollout_weights is push_weights_to_held_llms
    assert adapt_worker_class(adapted) is adapted  # adapting twice changes nothing


def test_a_worker_that_calls_super_and_syncs_itself_is_used_as_it_is():
    assert adapt_worker_class(ClassicWorker) is ClassicWorker
    assert adapt_worker_class(ActorRolloutWorker) is ActorRolloutWorker


def test_a_worker_that_is_not_an_actor_rollout_worker_or_lacks_generate_is_refused():
    class NotAWorker:
        def generate(self, prompts):
            return prompts

    class NoGenerate(ActorRolloutWorker):
        def __init__(self, model_name):
            pass

    with pytest.raises(TypeError, match="not a subclass of ActorRolloutWorker"):
        adapt_worker_class(NotAWorker)
    with pytest.raises(TypeError, match="no generate"):
        adapt_worker_class(NoGenerate)
    with pytest.raises(TypeError, match="must be a class"):
        adapt_worker_class(NoGenerate.__new__(NoGenerate))


def test_worker_kwargs_name_the_policy_model():
    assert model_named_by({"model_name": "/m", "tensor_parallel_size": 1}) == "/m"
    assert model_named_by({"tensor_parallel_size": 1}) is None


def test_critic_and_reward_model_arguments_become_gae_with_that_critic_and_an_enabled_reward_model():
    assert programmatic_overrides("/critic", "/rm", "/policy") == [
        "actor_rollout_ref.model.path=/policy", "algorithm.adv_estimator=gae", "critic.model.path=/critic",
        "reward_model.enable=true", "reward_model.model.path=/rm",
    ]
    assert programmatic_overrides(None, lambda *a: 1.0, None) == []  # a callable is the reward function
    with pytest.raises(TypeError, match="sequence-classification"):
        programmatic_overrides(None, 3, None)


def test_no_config_means_the_embedded_default_task_also_with_the_workers_model(tmp_path):
    from verl_like.models.tiny import build_tiny_model

    tiny_model = build_tiny_model(tmp_path / "m")
    config = resolve_trainer_config(None, [])
    assert config.actor_rollout_ref.model.path == "tiny" and config.data.train_files == ("synthetic:sort",)
    named = resolve_trainer_config(None, programmatic_overrides(None, None, str(tiny_model)))
    assert named.actor_rollout_ref.model.path == str(tiny_model)
    assert (named.algorithm.adv_estimator, named.actor_rollout_ref.rollout.n) == ("grpo", 8)  # still the task's
    with pytest.raises(TypeError, match="list of key=value overrides"):
        resolve_trainer_config(config, ["algorithm.adv_estimator=gae"])
