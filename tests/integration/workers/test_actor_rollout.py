"""ActorRolloutWorker on a real 2-rank Ray group (gloo, fp32, tiny Qwen2, in-process vLLM), with TP=1 and TP=2, and
a Megatron TP=2 actor syncing into vLLM at TP=1.

After a real FSDP2 PPO update on both ranks: vLLM's greedy tokens equal the HF engine's on the updated weights,
vLLM's sampled-token log-probs match the actor's compute_log_prob, the sliced sync and the full-tensor path
leave bit-identical vLLM weights (read back through vLLM's own linear kernels), also with a bucket smaller than
the largest parameter, and the reference policy still scores with the initial weights.
"""

from __future__ import annotations

import sys

import pytest
import ray
import torch

pytest.importorskip("vllm")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from verl_like.config.actor import ActorConfig, OptimConfig  # noqa: E402
from verl_like.config.megatron import MegatronConfig  # noqa: E402
from verl_like.config.model import RefConfig  # noqa: E402
from verl_like.config.rollout import RolloutConfig  # noqa: E402
from verl_like.models.tiny import build_tiny_model  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.shapes.decoder import DecoderShape  # noqa: E402
from verl_like.resharding.transports.colocated_sliced import SlicedWeightSync  # noqa: E402
from verl_like.resharding.transports.full import full_weight_sync  # noqa: E402
from verl_like.rollout.from_config import sampling_config  # noqa: E402
from verl_like.rollout.hf import HFRolloutEngine  # noqa: E402
from verl_like.single_controller import (  # noqa: E402
    Dispatch, ResourcePool, RoleSpec, WorkerError, WorkerGroup, register,
)
from verl_like.workers.actor_rollout import ActorRolloutWorker  # noqa: E402

from batch_helpers import prompt_batch  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules

PROMPTS = ["1+2=?", "what is 3*4? answer:", "ab", "(7-5)*2 = "]
SMALL_BUCKET = 4096  # bytes; the largest parameter (gate_proj, 256 x 128 fp32) has 131072


def readback(model) -> dict[str, torch.Tensor]:
    """This rank's effective vLLM weights: linear layers through their (CPU-repacked) kernels applied to I."""
    from vllm.model_executor.layers.linear import LinearBase

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            eye = torch.eye(module.input_size_per_partition, dtype=torch.float32)
            out[f"{name}.weight"] = module.quant_method.apply(module, eye, None).t().contiguous()
            if getattr(module, "bias", None) is not None:
                out[f"{name}.bias"] = module.bias.detach().clone()
        else:
            for pname, param in module.named_parameters(recurse=False):
                out[f"{name}.{pname}"] = param.detach().clone()
    return out


class ProbeWorker(ActorRolloutWorker):
    """Adds what the tests need to look inside a rank."""

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def rollout_state(self) -> dict[str, object]:
        return {"asleep": getattr(self.rollout, "_asleep", None), "engine": type(self.rollout).__name__,
                "sync": "sliced" if type(self.transport).__name__ == "SlicedTransport" else "full"}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def rollout_weights(self) -> dict[str, torch.Tensor]:
        from verl_like.rollout.vllm_compat import model_runner_model

        return readback(model_runner_model(self.rollout.llm))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def full_actor_state(self) -> dict[str, torch.Tensor]:
        return {name: tensor.clone() for name, tensor in self.actor.engine.full_state_iterator()}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_as(self, mode: str, bucket_bytes: int = 1 << 20) -> dict[str, float]:
        if mode == "full":
            return full_weight_sync(self.actor.engine, self.rollout).metrics()
        shape = DecoderShape.from_hf_config(AutoConfig.from_pretrained(self.model_path))
        sync = SlicedWeightSync(self.actor.engine, self.rollout, shape, bucket_bytes, 60.0)
        return sync().metrics()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def scramble_rollout(self) -> None:
        generator = torch.Generator().manual_seed(7)
        self.rollout.load_weights(
            (name, torch.randn(t.shape, generator=generator)) for name, t in self.actor.engine.full_state_iterator()
        )


def with_meta(data: DataProto, **meta) -> DataProto:
    return DataProto(data.batch, data.non_tensor_batch, {**data.meta_info, **meta})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("actor_rollout") / "tiny"))


@pytest.fixture(scope="module")
def pool(ray_cluster):
    p = ResourcePool.create([2], device="cpu", cpus_per_process=1.0, name="actor_rollout_test")
    yield p
    p.remove()


ACTOR = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, optim=OptimConfig(lr=2e-2, weight_decay=0.0))
COMMON = dict(dtype="float32", prompt_length=32, response_length=10, n=2, temperature=0.8, max_num_seqs=16)
# Each variant also exercises other rollout options: weight sync mode, sleeping between rollouts, log-prob
# micro-batching by rows or by token budget, the bucket size.
VARIANTS = {
    "tp1": RolloutConfig(tensor_model_parallel_size=1, weight_sync_mode="full", free_cache_engine=False,
                         log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=64, **COMMON),
    "tp2": RolloutConfig(tensor_model_parallel_size=2, weight_sync_mode="sliced", free_cache_engine=True,
                         log_prob_micro_batch_size_per_gpu=3, update_weights_bucket_megabytes=1, **COMMON),
    "hf": RolloutConfig(name="hf", **COMMON),
    # The Megatron actor at TP=2 (one DP rank: both ranks get the same rows) into vLLM at TP=1 on each rank: every
    # rank needs whole tensors, half of each TP-split one comes from the peer.
    "megatron_tp2": RolloutConfig(tensor_model_parallel_size=1, weight_sync_mode="sliced", free_cache_engine=False,
                                  log_prob_micro_batch_size_per_gpu=4, **COMMON),
}
ACTORS = {"megatron_tp2": ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, strategy="megatron",
                                      megatron=MegatronConfig(tensor_model_parallel_size=2),
                                      optim=OptimConfig(lr=2e-2, weight_decay=0.0))}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def trained(request, pool, model_dir):
    """A group after one PPO update whose weights were synced into its rollout engine, plus the update's inputs."""
    rollout = VARIANTS[request.param]
    tp = rollout.tensor_model_parallel_size
    spec = RoleSpec(ProbeWorker, (model_dir, ACTORS.get(request.param, ACTOR), rollout, RefConfig()))
    group = WorkerGroup(pool, spec, name=f"ar_{request.param}")
    try:
        group.init_model()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        prompts = prompt_batch(tokenizer, PROMPTS)
        greedy_before = group.generate_sequences(with_meta(prompts, do_sample=False))
        batch = group.generate_sequences(prompts)
        batch.meta_info.pop("metrics")
        old = group.compute_log_prob(batch)
        old.meta_info.pop("metrics")
        batch = batch.union(old)
        ref = group.compute_ref_log_prob(batch)
        signs = torch.tensor([1.0, -1.0]).repeat(len(PROMPTS)).unsqueeze(1)
        batch.batch["advantages"] = signs * batch.batch["response_mask"]
        update = group.update_actor(batch)
        sync = group.sync_weights()
        yield dict(group=group, tp=tp, rollout=rollout, prompts=prompts, greedy_before=greedy_before,
                   batch=batch, ref=ref, update=update, sync=sync)
    finally:
        try:
            group.close()  # frees vLLM's shared memory, which a killed actor would leave behind
        finally:
            group.shutdown()


def hf_model(model_dir, state=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def test_greedy_tokens_after_the_update_match_hf_on_the_updated_weights(trained, model_dir):
    group, rollout, prompts = trained["group"], trained["rollout"], trained["prompts"]
    assert trained["update"].meta_info["metrics"]["actor/grad_norm"][0] > 0
    updated = hf_model(model_dir, group.full_actor_state()[0])
    greedy = sampling_config(rollout, greedy=True)
    expected = HFRolloutEngine(updated).generate(prompts, greedy)
    got = group.generate_sequences(with_meta(prompts, validate=True))  # val_kwargs: greedy by default
    assert torch.equal(got.batch["responses"], expected.batch["responses"])
    assert torch.equal(got.batch["response_mask"], expected.batch["response_mask"])
    # The update moved the policy: the old greedy answers are gone.
    assert not torch.equal(got.batch["responses"], trained["greedy_before"].batch["responses"])
    metrics = trained["sync"][0]
    assert metrics["weight_sync/model_bytes"] > 0 and metrics["weight_sync/wall_s"] > 0


def test_sampled_token_log_probs_match_the_actor(trained):
    group = trained["group"]
    out = group.generate_sequences(trained["prompts"])
    assert out.meta_info["temperature"] == 0.8 and len(out) == 2 * len(PROMPTS)
    rollout = out.meta_info["metrics"]
    # One rate for the whole rollout (the worker's all-reduce), not each engine's own.
    assert rollout["rollout/tokens_per_s"][0] > 0 and len(set(rollout["rollout/tokens_per_s"])) == 1
    assert rollout["rollout/tokens_per_s"][0] == pytest.approx(
        sum(rollout["rollout/generated_tokens"]) / rollout["rollout/generate_s"][0])
    scored = group.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    diff = (out.batch["rollout_log_probs"] - scored.batch["old_log_probs"]).abs()[mask]
    assert float(diff.mean()) <= 1e-3
    metrics = scored.meta_info["metrics"]
    assert metrics["rollout/logprob_diff_mean"][0] == pytest.approx(float(diff.mean()), rel=1e-4, abs=1e-9)
    assert metrics["rollout/logprob_diff_max"][0] == pytest.approx(float(diff.max()), rel=1e-4, abs=1e-9)
    assert "entropy" in scored.batch.keys()


def test_reference_keeps_the_initial_policy(trained, model_dir):
    tensors, ref = trained["batch"].batch, trained["ref"].batch["ref_log_probs"]
    logits = hf_model(model_dir)(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"],
                                 position_ids=tensors["position_ids"]).logits.detach()
    prompt_len, response_len = tensors["prompts"].shape[1], tensors["responses"].shape[1]
    scaled = logits[:, prompt_len - 1:prompt_len - 1 + response_len] / 0.8  # the rollout's temperature
    expected = torch.log_softmax(scaled, dim=-1).gather(-1, tensors["responses"].unsqueeze(-1)).squeeze(-1)
    mask = tensors["response_mask"].bool()
    assert float((ref - expected).abs()[mask].max()) <= 1e-4


def test_variant_options_take_effect(trained):
    rollout, states = trained["rollout"], trained["group"].rollout_state()
    for state in states:
        assert state["engine"] == ("HFRolloutEngine" if rollout.name == "hf" else "VLLMRolloutEngine")
        sliced = rollout.name == "vllm" and rollout.weight_sync_mode == "sliced"
        assert state["sync"] == ("sliced" if sliced else "full")
        if rollout.name == "vllm":  # asleep between rollouts exactly when free_cache_engine is on
            assert state["asleep"] is rollout.free_cache_engine


def test_sliced_and_full_syncs_leave_identical_vllm_weights(trained):
    if trained["rollout"].name != "vllm":
        pytest.skip("reads vLLM's weights")
    group = trained["group"]
    sliced = group.rollout_weights()
    group.sync_as("full")
    full = group.rollout_weights()
    group.scramble_rollout()
    scrambled = group.rollout_weights()
    metrics = group.sync_as("sliced", SMALL_BUCKET)
    small_bucket = group.rollout_weights()
    for rank in range(2):
        assert sliced[rank].keys() == full[rank].keys()
        for name, tensor in full[rank].items():
            assert torch.equal(sliced[rank][name], tensor), (rank, name)
            assert torch.equal(small_bucket[rank][name], tensor), (rank, name)
        assert not any(torch.equal(scrambled[rank][n], t) for n, t in full[rank].items() if "norm" not in n)
    assert metrics[0]["weight_sync/buckets"] > 10
    if trained["tp"] == 2:  # each rank holds half of a row-parallel weight: different shards on the two ranks
        name = "model.layers.0.self_attn.o_proj.weight"
        assert full[0][name].shape == (128, 64) and not torch.equal(full[0][name], full[1][name])


def ppo_step(group, prompts) -> None:
    """generate -> old log-probs -> advantages (+1 for each prompt's first sample, -1 else) -> update."""
    batch = group.generate_sequences(prompts)
    batch.meta_info.pop("metrics")
    old = group.compute_log_prob(batch)
    old.meta_info.pop("metrics")
    batch = batch.union(old)
    signs = torch.tensor([1.0, -1.0]).repeat(len(batch) // 2).unsqueeze(1)
    batch.batch["advantages"] = signs * batch.batch["response_mask"]
    group.update_actor(batch)


def test_checkpoint_round_trip_restores_the_rollout_policy(trained, tmp_path):
    """Runs last for its variant: another update, then load_checkpoint brings actor and rollout back."""
    if trained["rollout"].name == "hf":
        pytest.skip("the vLLM variants cover it")
    group, prompts = trained["group"], with_meta(trained["prompts"], do_sample=False)
    saved = group.generate_sequences(prompts).batch["responses"]
    group.save_checkpoint(str(tmp_path / "ckpt"))
    ppo_step(group, trained["prompts"])
    # The driver owns the sync: a stale engine refuses to generate instead of syncing on its own.
    stale = r"holds the weights of step \d+ but the actor is at step \d+; call sync_weights"
    with pytest.raises(WorkerError, match=stale):
        group.generate_sequences(prompts)
    group.sync_weights()
    moved = group.generate_sequences(prompts).batch["responses"]
    group.load_checkpoint(str(tmp_path / "ckpt"))
    restored = group.generate_sequences(prompts).batch["responses"]
    assert not torch.equal(moved, saved)
    assert torch.equal(restored, saved)
