"""Server mode on ONE GPU: a vLLM server (`python -m verl_like.serve`, started by `start_servers`) next to a 1-worker
FSDP2 trainer on the same device (rollout_pool.gpu_fraction=0.5), weights through vLLM's weight-transfer API, once
per weight path (`rollout.server.weight_transfer`): our gloo engine and vLLM's CUDA-IPC engine (`-k ipc` runs one).

The GPU twin of tests/integration/rollout/test_server_mode.py: after the first sync and after a real PPO update and
its sync, the server's sampled-token log-probs agree with the actor's to bf16 precision, the server's weights are
the actor's (parameter sums through /collective_rpc against the actor's full tensors in the wire dtype), and the
server's actor and the trainer's worker share the one GPU's bundle.
"""

from __future__ import annotations

import sys

import pytest
import ray
import torch

pytest.importorskip("vllm")

from transformers import AutoTokenizer  # noqa: E402

from verl_like.config.actor import ActorConfig, OptimConfig  # noqa: E402
from verl_like.config.loader import load_config  # noqa: E402
from verl_like.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.servers import ServerGenerator  # noqa: E402
from verl_like.rollout.vllm_server import VLLM_SERVER  # noqa: E402
from verl_like.single_controller import Dispatch, ResourcePool, RoleSpec, WorkerGroup, register  # noqa: E402
from verl_like.trainer.rollout_handle import ServerRolloutHandle, start_servers  # noqa: E402
from verl_like.workers.actor_rollout import ActorRolloutWorker  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
from batch_helpers import prompt_batch  # noqa: E402

PROMPTS = ["1+2=?", "what is 3*4? answer:", "ab", "(7-5)*2 = "] * 4
# head_dim 64: FlashAttention's kernels (the kit has FA3 only) take it; the CPU tests' tiny model has 32.
SPEC = TinyModelSpec(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512)
ACTOR = ActorConfig(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=8,
                    optim=OptimConfig(lr=1e-2, weight_decay=0.0))
FRACTION = 0.5


class FingerprintedActor(ActorRolloutWorker):
    """The actor-rollout worker plus the fingerprint of its full weights that the server's must equal."""

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def weight_sums(self) -> dict[str, float]:
        """{"sum", "sum_squares", "numel"} in float64 of the actor's full tensors cast to the servers' bf16, as
        `verl_like_weight_sums` computes them in the server (fused q/k/v and gate/up add up the same)."""
        total = squares = 0.0
        numel = 0
        with self._onloaded(self.actor.engine):
            for _, tensor in self.actor.engine.full_state_iterator():
                values = tensor.to(torch.bfloat16).double()
                total += float(values.sum())
                squares += float(values.square().sum())
                numel += values.numel()
        return {"sum": total, "sum_squares": squares, "numel": numel}


@pytest.fixture(scope="module", params=["gloo", "ipc"])
def shared(request, ray_cluster, tmp_path_factory):
    weight_transfer = request.param
    model_dir = str(build_tiny_model(tmp_path_factory.mktemp("gpu_server") / "tiny", SPEC))
    config = load_config([
        "actor_rollout_ref.rollout.mode=server", "trainer.device=cuda", "trainer.n_gpus_per_node=1",
        f"rollout_pool.gpu_fraction={FRACTION}", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.enforce_eager=true",
        "data.max_prompt_length=32", "data.max_response_length=24", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes=1", f"actor_rollout_ref.model.path={model_dir}",
    ], check_paths=False)
    rollout = config.actor_rollout_ref.rollout
    placement = config.placement
    assert placement.shares_trainer_devices and placement.trainer_fraction == 1 - FRACTION
    assert placement.weight_transfer("cuda") == "ipc"  # auto: the one server shares the trainer's one GPU
    pool = ResourcePool.create([1], device="cuda", cpus_per_process=1.0, name=f"gpu_server_{weight_transfer}")
    group = WorkerGroup(pool, RoleSpec(FingerprintedActor, (model_dir, ACTOR, rollout)),
                        name=f"gpu_server_trainer_{weight_transfer}", resource_fraction=placement.trainer_fraction)
    handle = None
    try:
        group.init_model()  # before the server: vLLM sizes its KV cache while nothing else allocates
        clients, supervisors, owned = start_servers(config, model_dir, VLLM_SERVER.engine_args(rollout,
                                                    weight_transfer=weight_transfer), "cuda", 1.0, 600.0,
                                                    trainer_pool=pool)
        assert owned is None  # the servers took no pool of their own
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        handle = ServerRolloutHandle(rollout, group, ServerGenerator(clients, tokenizer.pad_token_id), supervisors)
        connect = group.connect_rollout_servers([client.address for client in clients], None, weight_transfer)
        yield dict(group=group, handle=handle, prompts=prompt_batch(tokenizer, PROMPTS), connect=connect, pool=pool,
                   weight_transfer=weight_transfer)
    finally:
        if handle is not None:
            handle.close()
        group.close()
        group.shutdown()
        pool.remove()


def gap(handle: ServerRolloutHandle, group, prompts: DataProto, seed: int) -> float:
    """Mean |server log-prob - actor log-prob| over the response tokens of one seeded rollout."""
    batch = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": seed}))
    scored = group.compute_log_prob(batch)
    mask = batch.batch["response_mask"].bool()
    diff = (batch.batch["rollout_log_probs"] - scored.batch["old_log_probs"]).abs()[mask]
    print(f"\nGPU server (bf16) vs actor: mean |dlogp| {float(diff.mean()):.3e}, max {float(diff.max()):.3e} "
          f"over {int(mask.sum())} tokens")
    return float(diff.mean())


def server_sums(handle: ServerRolloutHandle) -> dict[str, float]:
    answer = handle.servers.clients[0].request("POST", "/collective_rpc", json={"method": "verl_like_weight_sums"})
    return answer["results"][0]


def assert_server_weights_are_the_actors(handle: ServerRolloutHandle, group) -> None:
    server, actor = server_sums(handle), group.weight_sums()[0]
    # vLLM pads the vocabulary rows of the embedding (and an untied head) to a multiple of 64 on GPUs and fills
    # the padding with zeros: more elements, the same sums (seen on the H200: 1,214,720 vs 1,209,600).
    assert server["numel"] >= actor["numel"]
    for key in ("sum", "sum_squares"):
        assert server[key] == pytest.approx(actor[key], rel=1e-6, abs=1e-6), key


def test_the_server_and_the_trainer_share_one_gpu_bundle(shared):
    # The server could only start inside the trainer's one-GPU bundle by taking a fraction of it.
    assert shared["pool"].slots[0].placement_group.bundle_specs[0]["GPU"] == 1.0
    assert len(shared["pool"].slots) == 1 and len(shared["handle"].servers.clients) == 1
    assert shared["handle"].supervisors and all(ray.get(s.alive.remote()) for s in shared["handle"].supervisors)


def test_server_log_probs_match_the_actor_in_bf16_before_and_after_an_update(shared):
    group, handle, prompts = shared["group"], shared["handle"], shared["prompts"]
    assert shared["connect"][0]["weight_sync/model_bytes"] > 0
    assert_server_weights_are_the_actors(handle, group)  # the first sync, at connect
    assert gap(handle, group, prompts, seed=1) <= 2e-2  # bf16 rounding; a stale or garbled sync gives O(1)
    batch = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": 11}))
    old = group.compute_log_prob(batch)
    old.meta_info.pop("metrics", None)
    batch = batch.union(old)
    signs = torch.tensor([1.0, -1.0]).repeat(len(PROMPTS)).unsqueeze(1)
    batch.batch["advantages"] = signs * batch.batch["response_mask"]
    assert group.update_actor(batch).meta_info["metrics"]["actor/grad_norm"][0] > 0
    stale = gap(handle, group, prompts, seed=2)
    before = server_sums(handle)
    metrics = handle.sync_weights()
    assert metrics[0]["weight_sync/buckets"] > 1  # 1 MiB buckets: several buckets per round, on either path
    fresh = gap(handle, group, prompts, seed=3)
    assert fresh <= 2e-2 and fresh < stale
    after = server_sums(handle)
    assert after["numel"] == before["numel"] and after["sum_squares"] != before["sum_squares"]
    assert_server_weights_are_the_actors(handle, group)
    # A second round into the same server: buffers of the first were released, none is read stale.
    handle.sync_weights()
    assert_server_weights_are_the_actors(handle, group)
