"""LoRA keys: actor_rollout_ref.model.lora_* reach the actor's engine config; what a LoRA run cannot do here is
refused before Ray, naming the key and the reason."""

from __future__ import annotations

import pytest

from verl_like.config import ConfigError, load_config
from verl_like.engine.config import LoraSettings
from verl_like.engine.from_config import lora_settings
from verl_like.rollout.vllm_lora import vllm_max_lora_rank

SMOKE = ["+trainer=ci_smoke"]
M = "actor_rollout_ref.model"

BAD = [
    ([f"{M}.lora_rank=-1"], f"{M}.lora_rank=-1 must be >= 0"),
    ([f"{M}.lora_rank=8", f"{M}.lora_alpha=0"], f"{M}.lora_alpha=0 must be > 0"),
    ([f"{M}.lora_adapter_path=/some/adapter"], f"{M}.lora_adapter_path is set but lora_rank=0"),
    ([f"{M}.lora_rank=8", f"{M}.target_modules=[]"], f"{M}.target_modules is empty"),
    ([f"{M}.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron"],
     "the Megatron engine builds no adapters"),
    (["algorithm.adv_estimator=gae", "critic.model.lora_rank=8"], "critic.model.lora_rank=8: the critic trains every"),
    ([f"{M}.lora_rank=1024"], "exceeds vLLM's largest max_lora_rank 512"),
    ([f"{M}.lora_rank=8", "actor_rollout_ref.rollout.mode=server", "async_training.enable=true",
      "async_training.partial_rollout=true", "async_training.staleness=1"],
     "a request frozen across a sync keeps the adapter it started with"),
    ([f"{M}.lora_rank=8", "actor_rollout_ref.rollout.sync_check_tolerance=0"],
     "actor_rollout_ref.rollout.sync_check_tolerance=0.0 must be > 0"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_lora_setting_is_refused_naming_it(overrides, message, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError) as excinfo:
        load_config(SMOKE + overrides)
    assert message in str(excinfo.value)


def test_lora_keys_reach_the_actor_engine_settings():
    config = load_config(SMOKE + [f"{M}.lora_rank=8", f"{M}.lora_alpha=32", f"{M}.target_modules=[q_proj,v_proj]",
                                  f"{M}.exclude_modules=[o_proj]", f"{M}.lora.merge=true"])
    model = config.actor_rollout_ref.model
    assert lora_settings(model) == LoraSettings(rank=8, alpha=32, target_modules=("q_proj", "v_proj"),
                                                exclude_modules=("o_proj",))
    assert model.lora.merge and config.actor_rollout_ref.rollout.sync_check


def test_server_mode_takes_adapter_only_sync_and_partial_rollout_merged():
    adapter = load_config(SMOKE + [f"{M}.lora_rank=8", "actor_rollout_ref.rollout.mode=server"])
    assert adapter.actor_rollout_ref.rollout.mode == "server" and not adapter.actor_rollout_ref.model.lora.merge
    merged = load_config(SMOKE + [f"{M}.lora_rank=8", f"{M}.lora.merge=true", "actor_rollout_ref.rollout.mode=server",
                                  "async_training.enable=true", "async_training.partial_rollout=true",
                                  "async_training.staleness=1"])
    assert merged.async_training.partial_rollout


def test_lora_is_off_by_default():
    model = load_config(SMOKE).actor_rollout_ref.model
    assert model.lora_rank == 0 and model.target_modules == "all-linear" and lora_settings(model) is None


@pytest.mark.parametrize(("rank", "engine_rank"), [(1, 1), (4, 8), (8, 8), (9, 16), (300, 320), (512, 512)])
def test_vllm_max_lora_rank_is_the_smallest_allowed_that_holds_the_adapter(rank, engine_rank):
    assert vllm_max_lora_rank(rank) == engine_rank


def test_adapter_only_server_mode_on_cuda_is_accepted_in_both_weight_paths():
    """Adapter-only sync into a server on CUDA (measured on the H200: bench/gpu_suite.sh server_lora_1gpu) loads
    under either weight-transfer engine; only the partial-rollout combination stays refused."""
    base = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.rollout.mode=server", "trainer.device=cuda"]
    for transfer in ("auto", "gloo", "ipc"):
        config = load_config([*base, "trainer.n_gpus_per_node=1", "rollout_pool.gpu_fraction=0.3",
                              "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                              f"actor_rollout_ref.rollout.server.weight_transfer={transfer}"],
                             check_paths=False)
        assert not config.actor_rollout_ref.model.lora.merge and config.placement.uses_servers
    with pytest.raises(ConfigError, match="async_training.partial_rollout=true"):
        load_config([*base, "async_training.enable=true", "async_training.staleness=1",
                     "async_training.partial_rollout=true"], check_paths=False)
