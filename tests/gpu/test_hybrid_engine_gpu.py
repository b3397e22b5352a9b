"""ActorRolloutWorker on GPUs: FSDP2 (nccl) + in-process vLLM in bf16 with sleep mode, TP=1 on one GPU, TP=2 on two.

The twin of tests/integration/workers/test_actor_rollout.py. After a real PPO update: vLLM's sampled-token
log-probs agree with the actor's on the same tokens to bf16 precision (and the gap is printed for
docs/benchmarks.md), the sliced sync and the full-tensor path leave identical vLLM weights, and sleeping between
rollouts frees the KV cache's device memory.
"""

from __future__ import annotations

import sys

import pytest
import ray
import torch

pytest.importorskip("vllm")

from transformers import AutoConfig, AutoTokenizer  # noqa: E402

from verl_like.config.actor import ActorConfig, OptimConfig  # noqa: E402
from verl_like.config.rollout import RolloutConfig  # noqa: E402
from verl_like.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402
from verl_like.shapes.decoder import DecoderShape  # noqa: E402
from verl_like.resharding.transports.colocated_sliced import SlicedWeightSync  # noqa: E402
from verl_like.resharding.transports.full import full_weight_sync  # noqa: E402
from verl_like.single_controller import Dispatch, ResourcePool, RoleSpec, WorkerGroup, register  # noqa: E402
from verl_like.workers.actor_rollout import ActorRolloutWorker  # noqa: E402

from batch_helpers import prompt_batch  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


PROMPTS = ["1+2=?", "what is 3*4? answer:", "ab", "(7-5)*2 = "] * 4
# head_dim 64: FlashAttention's kernels (the kit has FA3 only) take it; the CPU tests' tiny model has 32.
SPEC = TinyModelSpec(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512)


class GpuProbeWorker(ActorRolloutWorker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def rollout_weights(self) -> dict[str, torch.Tensor]:
        from verl_like.rollout.vllm_compat import model_runner_model

        self._wake_rollout()  # asleep after a rollout: the weights sit in host memory, their device pages unmapped
        model = model_runner_model(self.rollout.llm)
        return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_as(self, mode: str, bucket_bytes: int = 1 << 20) -> dict[str, float]:
        self._wake_rollout()
        with self._onloaded(self.actor.engine):
            if mode == "full":
                return full_weight_sync(self.actor.engine, self.rollout).metrics()
            shape = DecoderShape.from_hf_config(AutoConfig.from_pretrained(self.model_path))
            return SlicedWeightSync(self.actor.engine, self.rollout, shape, bucket_bytes, 120.0)().metrics()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def free_memory_asleep_and_awake(self) -> tuple[int, int]:
        """Free device bytes with the engine asleep (as after a rollout), then awake."""
        torch.cuda.synchronize()
        self._sleep_rollout()
        asleep = torch.cuda.mem_get_info()[0]
        self._wake_rollout()
        awake = torch.cuda.mem_get_info()[0]
        return asleep, awake


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("gpu_hybrid") / "tiny", SPEC))


ACTOR = ActorConfig(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=8,
                    optim=OptimConfig(lr=1e-2, weight_decay=0.0))


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def trained(request, ray_cluster, model_dir):
    tp = request.param
    if gpu_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    rollout = RolloutConfig(tensor_model_parallel_size=tp, dtype="bfloat16", prompt_length=32, response_length=24,
                            n=2, temperature=1.0, gpu_memory_utilization=0.3, free_cache_engine=True,
                            weight_sync_mode="sliced", update_weights_bucket_megabytes=1)
    pool = ResourcePool.create([tp], device="cuda", cpus_per_process=1.0, name=f"gpu_hybrid_tp{tp}")
    group = WorkerGroup(pool, RoleSpec(GpuProbeWorker, (model_dir, ACTOR, rollout, None)), name=f"gpu_ar_tp{tp}")
    try:
        group.init_model()
        prompts = prompt_batch(AutoTokenizer.from_pretrained(model_dir), PROMPTS)
        batch = group.generate_sequences(prompts)
        batch.meta_info.pop("metrics")
        old = group.compute_log_prob(batch)
        old.meta_info.pop("metrics")
        batch = batch.union(old)
        signs = torch.tensor([1.0, -1.0]).repeat(len(PROMPTS)).unsqueeze(1)
        batch.batch["advantages"] = signs * batch.batch["response_mask"]
        update = group.update_actor(batch)
        sync = group.sync_weights()
        yield dict(group=group, tp=tp, prompts=prompts, update=update, sync=sync)
    finally:
        try:
            group.close()
        finally:
            group.shutdown()
            pool.remove()


def test_rollout_log_probs_match_the_actor_in_bf16(trained):
    group = trained["group"]
    assert trained["update"].meta_info["metrics"]["actor/grad_norm"][0] > 0
    out = group.generate_sequences(trained["prompts"])
    scored = group.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    diff = (out.batch["rollout_log_probs"] - scored.batch["old_log_probs"]).abs()[mask]
    print(f"\nGPU tp={trained['tp']} bf16 rollout vs fp32-master actor: mean |dlogp| {float(diff.mean()):.3e}, "
          f"max {float(diff.max()):.3e} over {int(mask.sum())} tokens")
    assert float(diff.mean()) <= 2e-2  # bf16 rounding; a stale or garbled sync gives O(1)


def test_sliced_and_full_syncs_leave_identical_vllm_weights(trained):
    group = trained["group"]
    sliced = group.rollout_weights()
    metrics = group.sync_as("full")
    full = group.rollout_weights()
    assert metrics[0]["weight_sync/model_bytes"] > 0
    for rank in range(trained["tp"]):
        assert sliced[rank].keys() == full[rank].keys()
        for name, tensor in full[rank].items():
            assert torch.equal(sliced[rank][name], tensor), (rank, name)
    small = group.sync_as("sliced", 4096)  # a bucket smaller than the largest parameter
    assert small[0]["weight_sync/buckets"] > 10
    assert all(torch.equal(a, b) for a, b in zip(group.rollout_weights()[0].values(), full[0].values()))


def test_sleeping_between_rollouts_frees_the_kv_cache(trained):
    for asleep, awake in trained["group"].free_memory_asleep_and_awake():
        print(f"\nfree device memory asleep {asleep / 2**30:.1f} GiB, awake {awake / 2**30:.1f} GiB")
        assert asleep - awake > 2**30
