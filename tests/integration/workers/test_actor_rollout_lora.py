"""A LoRA actor on a real 2-rank Ray group (gloo, fp32, tiny Qwen2, PEFT on FSDP2, in-process vLLM with LoRA).

After each of two PPO updates: vLLM serving the adapter gives the rollout's tokens the log-probs that an
independent PEFT model (HF base + the adapter's tensors, no FSDP, no vLLM) gives them, and not the base model's;
the sync after an update moves the adapter's bytes alone (the base went once, at init); the reference is the base
model (the actor with its adapter off); checkpoints hold the adapter alone and restore it exactly; model_merger's
merged and adapter exports score like the trained policy. The sync check fails a run whose engine gets a wrong
adapter (or wrong full weights), naming the engine and both versions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest
import ray
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from verl_like.config.actor import ActorConfig, OptimConfig  # noqa: E402
from verl_like.config.model import ModelConfig, RefConfig  # noqa: E402
from verl_like.config.rollout import RolloutConfig  # noqa: E402
from verl_like.models.tiny import build_tiny_model  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.single_controller import Dispatch, ResourcePool, RoleSpec, WorkerError, WorkerGroup, register  # noqa: E402
from verl_like.workers.actor_rollout import ActorRolloutWorker  # noqa: E402

from batch_helpers import prompt_batch  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules

PROMPTS = ["1+2=?", "what is 3*4? answer:", "ab", "(7-5)*2 = "]
ACTOR = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, optim=OptimConfig(lr=5e-2, weight_decay=0.0))
ROLLOUT = RolloutConfig(dtype="float32", prompt_length=32, response_length=10, n=2, temperature=1.0, max_num_seqs=16,
                        free_cache_engine=True)


class LoraProbeWorker(ActorRolloutWorker):
    """Adds what the tests need to look inside a rank."""

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        return self.actor.engine.adapter_state()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def adapter_config(self) -> dict:
        return self.actor.engine.adapter_config()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def inject_fault(self, kind: str | None) -> None:
        """From now on the engine is fed a wrong adapter ("adapter": B three times too large) or wrong base weights
        ("base": down_proj halved, sent again at the next sync); None feeds it right again."""
        engine = self.rollout
        for name in ("load_adapter", "load_weights"):
            engine.__dict__.pop(name, None)  # back to the class's methods
        if kind == "adapter":
            right = engine.load_adapter
            engine.load_adapter = lambda tensors, config, version: right(
                {n: t * 3 if ".lora_B." in n else t for n, t in tensors.items()}, config, version)
        elif kind == "base":
            right = engine.load_weights
            engine.load_weights = lambda named: right((n, t * 0.5 if n.endswith("down_proj.weight") else t)
                                                      for n, t in named)
        self.transport.forget_engine_weights()  # the next sync sends the base again

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def trainable_parameter_counts(self) -> dict[str, int]:
        optimizer = self.actor.engine.optimizer
        optimized = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
        trainable = sum(p.numel() for p in self.actor.engine.model.parameters() if p.requires_grad)
        return {"optimized": optimized, "trainable": trainable, "transport": type(self.transport).__name__}


def with_meta(data: DataProto, **meta) -> DataProto:
    return DataProto(data.batch, data.non_tensor_batch, {**data.meta_info, **meta})


def response_log_probs(model, batch: DataProto) -> torch.Tensor:
    """Log-probs (temperature 1) of the batch's response tokens under an HF / PEFT model; (batch, response_len)."""
    t = batch.batch
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                       position_ids=t["position_ids"]).logits.float()
    prompt_len, response_len = t["prompts"].shape[1], t["responses"].shape[1]
    scores = torch.log_softmax(logits[:, prompt_len - 1:prompt_len - 1 + response_len], dim=-1)
    return scores.gather(-1, t["responses"].unsqueeze(-1)).squeeze(-1)


def peft_policy(model_dir: str, adapter: dict[str, torch.Tensor], config: dict):
    """The independent reference: HF base + PEFT LoRA with the adapter's tensors, nothing of ours in between."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=config["r"], lora_alpha=config["lora_alpha"], lora_dropout=0.0,
                                            target_modules=config["target_modules"]))
    result = set_peft_model_state_dict(model, adapter)
    assert not result.unexpected_keys
    return model.eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("actor_rollout_lora") / "tiny"))


@pytest.fixture(scope="module")
def pool(ray_cluster):
    p = ResourcePool.create([2], device="cpu", cpus_per_process=1.0, name="actor_rollout_lora_test")
    yield p
    p.remove()


def ppo_update(group, prompts) -> tuple[DataProto, dict]:
    """One rollout + PPO update with fixed +/- advantages, then the sync; returns the batch and the sync metrics."""
    batch = group.generate_sequences(prompts)
    batch.meta_info.pop("metrics")
    old = group.compute_log_prob(batch)
    old.meta_info.pop("metrics")
    batch = batch.union(old)
    signs = torch.tensor([1.0, -1.0]).repeat(len(PROMPTS)).unsqueeze(1)
    batch.batch["advantages"] = signs * batch.batch["response_mask"]
    group.update_actor(batch)
    return batch, group.sync_weights()[0]


@pytest.fixture(scope="module")
def trained(pool, model_dir, tmp_path_factory):
    model = ModelConfig(path=model_dir, lora_rank=8, lora_alpha=16)
    group = WorkerGroup(pool, RoleSpec(LoraProbeWorker, (model_dir, ACTOR, ROLLOUT, RefConfig()),
                                       {"model": model}), name="ar_lora")
    checkpoint = str(tmp_path_factory.mktemp("lora_ckpt") / "actor")
    try:
        group.init_model()
        prompts = prompt_batch(AutoTokenizer.from_pretrained(model_dir), PROMPTS)
        steps = []
        for _ in range(2):
            _, sync = ppo_update(group, prompts)
            rollout = group.generate_sequences(prompts)
            steps.append(dict(sync=sync, rollout=rollout, adapter=group.adapter_tensors()[0],
                              ref=group.compute_ref_log_prob(rollout)))
            if len(steps) == 1:
                group.save_checkpoint(checkpoint)
        yield dict(group=group, steps=steps, checkpoint=checkpoint, prompts=prompts,
                   config=group.adapter_config()[0], counts=group.trainable_parameter_counts())
    finally:
        try:
            group.close()
        finally:
            group.shutdown()


def test_vllm_with_the_adapter_equals_the_peft_policy_after_each_update_and_differs_from_the_base(trained, model_dir):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for step in trained["steps"]:
        rollout = step["rollout"]
        mask = rollout.batch["response_mask"].bool()
        served = rollout.batch["rollout_log_probs"]
        expected = response_log_probs(peft_policy(model_dir, step["adapter"], trained["config"]), rollout)
        assert float((served - expected).abs()[mask].max()) <= 1e-4
        assert float((served - response_log_probs(base, rollout)).abs()[mask].mean()) >= 1e-2
        assert step["sync"]["rollout/sync_check_gap"] <= 1e-4


def test_only_adapter_parameters_train_and_sync_after_the_base_went_once(trained):
    adapter = trained["steps"][0]["adapter"]
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    for counts in trained["counts"]:
        assert counts["transport"] == "AdapterTransport"
        assert counts["optimized"] == counts["trainable"] < adapter_bytes  # sharded: half of the adapter per rank
    for step in trained["steps"]:
        sync = step["sync"]
        assert sync["sync/bytes"] == sync["sync/adapter_bytes"] == adapter_bytes
        assert sync["sync/base_bytes"] == 0
    assert all(".lora_A." in name or ".lora_B." in name for name in adapter)


def test_reference_is_the_base_model(trained, model_dir):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    step = trained["steps"][-1]
    mask = step["rollout"].batch["response_mask"].bool()
    expected = response_log_probs(base, step["rollout"])
    assert float((step["ref"].batch["ref_log_probs"] - expected).abs()[mask].max()) <= 1e-4


def test_checkpoint_holds_the_adapter_only_and_restores_it_exactly(trained):
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(trained["checkpoint"]).read_metadata()
    model_keys = [k for k in metadata.state_dict_metadata if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    group = trained["group"]
    group.load_checkpoint(trained["checkpoint"])
    restored = group.adapter_tensors()[0]
    saved = trained["steps"][0]["adapter"]
    assert restored.keys() == saved.keys()
    assert all(torch.equal(restored[name], saved[name]) for name in saved)
    # The restored adapter reached the engine: its rollout scores like the step-1 policy.
    rollout = group.generate_sequences(trained["prompts"])
    scored = group.compute_log_prob(rollout)
    assert scored.meta_info["metrics"]["rollout/logprob_diff_max"][0] <= 1e-4


def test_agent_loops_on_the_engine_generate_with_the_adapter(trained, model_dir):
    """Agent loops stream requests into the in-process engine one by one (rollout/token_generate.py); each must
    carry the adapter as the batched path's do, else the trainer trains on the base model's samples. From here on
    the group rolls out through agent loops."""
    from verl_like.config.loader import load_config
    from verl_like.experimental.agent_loop.runner import agent_config_dict, registry_snapshot

    group = trained["group"]
    config = load_config(["actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
                          "data.return_raw_chat=true", f"data.max_prompt_length={ROLLOUT.prompt_length}",
                          f"data.max_response_length={ROLLOUT.response_length}"])
    group.configure_agent_loops(agent_config_dict(config), registry_snapshot())
    rollout = group.generate_sequences(trained["prompts"])
    assert "agent/rollout_s" in rollout.meta_info["metrics"]  # it went through the agent loops
    rollout.meta_info.pop("metrics")
    scored = group.compute_log_prob(rollout)
    assert scored.meta_info["metrics"]["rollout/logprob_diff_max"][0] <= 1e-4  # the trainer's LoRA policy
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    mask = rollout.batch["response_mask"].bool()
    served = rollout.batch["rollout_log_probs"]
    assert float((served - response_log_probs(base, rollout)).abs()[mask].mean()) >= 1e-2  # not the base's


@pytest.mark.parametrize("export", ["merged", "adapter"])
def test_model_merger_exports_score_like_the_trained_policy(trained, model_dir, tmp_path, export):
    from verl_like.model_merger import main

    target = tmp_path / export
    main(["--local_dir", trained["checkpoint"], "--target_dir", str(target), "--export", export])
    if export == "adapter":
        from peft import PeftModel

        assert json.loads((target / "adapter_config.json").read_text())["r"] == 8
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                          str(target)).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    rollout = trained["steps"][0]["rollout"]  # sampled from the step-1 policy, which the checkpoint holds
    mask = rollout.batch["response_mask"].bool()
    assert float((response_log_probs(model, rollout) - rollout.batch["rollout_log_probs"]).abs()[mask].max()) <= 1e-4


@pytest.mark.parametrize("fault", ["adapter", "base"])
def test_sync_check_fails_a_run_whose_engine_is_fed_wrong_weights_naming_it(trained, fault):
    """Last in this file: it leaves the group's engine re-synced but with a fresh adapter name."""
    group = trained["group"]
    group.inject_fault(fault)
    try:
        with pytest.raises(WorkerError) as excinfo:
            group.sync_weights()
    finally:
        group.inject_fault(None)
    message = str(excinfo.value)
    named = re.search(r"sync check failed: rank [01]'s in-process VLLMRolloutEngine \(adapter policy-\d+-v(\d+)\)",
                      message)
    assert named, message
    # a re-sync of unchanged weights keeps the version (workers/weight_version.py): the engine and the trainer's
    # policy carry the same one, the adapter's name says it
    version = named.group(1)
    assert f"holding version {version} does not serve the trainer's policy of version {version}" in message
    assert group.sync_weights()[0]["rollout/sync_check_gap"] <= 1e-4  # fed right again, it passes
