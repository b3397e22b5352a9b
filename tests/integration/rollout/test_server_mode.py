"""Server mode on real parts: a vLLM server started with `python -m verl_like.serve` (the session's), a 2-rank FSDP2
actor group on Ray linked to it through vLLM's weight-transfer API (our gloo engine), generation from the driver.

After every actor update the server's sampled-token log-probs equal the actor's on the same tokens (fp32), and
before the sync they do not.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from batch_helpers import prompt_batch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from verl_like.config.actor import ActorConfig, OptimConfig  # noqa: E402
from verl_like.config.rollout import RolloutConfig, RolloutServerConfig  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.from_config import sampling_config  # noqa: E402
from verl_like.rollout.server_client import ServerClient, ServerError  # noqa: E402
from verl_like.rollout.servers import ServerGenerator  # noqa: E402
from verl_like.single_controller import ResourcePool, RoleSpec, WorkerGroup  # noqa: E402
from verl_like.trainer.rollout_handle import ServerRolloutHandle  # noqa: E402
from verl_like.workers.actor_rollout import ActorRolloutWorker  # noqa: E402

PROMPTS = ["sort 4021", "sort 973", "sort 51820", "sort 660"]
ACTOR = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, optim=OptimConfig(lr=5e-2, weight_decay=0.0))


@pytest.fixture(scope="module")
def linked(ray_cluster, warmstart_model, vllm_server):
    """The actor group linked to the session's server, and the driver-side rollout through it."""
    rollout = RolloutConfig(mode="server", server=RolloutServerConfig(address=(vllm_server,)), dtype="float32",
                            prompt_length=32, response_length=8, n=2, temperature=1.0)
    pool = ResourcePool.create([2], device="cpu", cpus_per_process=1.0, name="server_mode_test")
    group = WorkerGroup(pool, RoleSpec(ActorRolloutWorker, (warmstart_model, ACTOR, rollout)), name="server_mode")
    tokenizer = AutoTokenizer.from_pretrained(warmstart_model)
    servers = ServerGenerator([ServerClient(vllm_server, "server 0")], tokenizer.pad_token_id)
    try:
        group.init_model()
        connect = group.connect_rollout_servers([vllm_server])
        yield dict(group=group, handle=ServerRolloutHandle(rollout, group, servers),
                   prompts=prompt_batch(tokenizer, PROMPTS), connect=connect)
    finally:
        servers.close()
        group.close()
        group.shutdown()
        pool.remove()


def gap(handle: ServerRolloutHandle, group, prompts: DataProto, seed: int) -> float:
    """Largest |server log-prob - actor log-prob| over the response tokens of one seeded rollout."""
    batch = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": seed}))
    scored = group.compute_log_prob(batch)
    mask = batch.batch["response_mask"].bool()
    assert mask.sum() > 0
    diff = (batch.batch["rollout_log_probs"] - scored.batch["old_log_probs"]).abs()[mask]
    assert scored.meta_info["metrics"]["rollout/logprob_diff_max"][0] == pytest.approx(float(diff.max()), abs=1e-9)
    return float(diff.max())


def weight_sums(handle: ServerRolloutHandle) -> dict[str, float]:
    """The server's parameter fingerprint, through /collective_rpc into our worker extension (one worker)."""
    answer = handle.servers.clients[0].request("POST", "/collective_rpc", json={"method": "verl_like_weight_sums"})
    return answer["results"][0]


def update(group, handle: ServerRolloutHandle, prompts: DataProto) -> None:
    """One PPO update that pushes each prompt's first sample up and its second down."""
    batch = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": 11}))
    old = group.compute_log_prob(batch)
    old.meta_info.pop("metrics", None)
    batch = batch.union(old)
    signs = torch.tensor([1.0, -1.0]).repeat(len(PROMPTS)).unsqueeze(1)
    batch.batch["advantages"] = signs * batch.batch["response_mask"]
    metrics = group.update_actor(batch).meta_info["metrics"]
    assert metrics["actor/grad_norm"][0] > 0


def test_server_log_probs_equal_the_actor_after_each_update_and_differ_before(linked):
    group, handle, prompts = linked["group"], linked["handle"], linked["prompts"]
    assert linked["connect"][0]["weight_sync/model_bytes"] > 0  # connect sent the actor's weights once
    assert gap(handle, group, prompts, seed=1) <= 1e-5
    for round_ in range(2):
        update(group, handle, prompts)
        assert gap(handle, group, prompts, seed=2 + round_) > 1e-3  # the server still has the old policy
        before = weight_sums(handle)
        metrics = handle.sync_weights()
        assert metrics[0]["weight_sync/buckets"] >= 1 and metrics[1]["weight_sync/sent_bytes"] == 0  # rank 0 sends
        assert gap(handle, group, prompts, seed=5 + round_) <= 1e-5
        after = weight_sums(handle)
        assert after["numel"] == before["numel"] > 0 and after["sum_squares"] != before["sum_squares"]
    info = ServerClient(handle.servers.clients[0].address, "probe").request("GET", "/weight_info")
    assert info["weight_version"] == "2"  # the actor's optimizer step rides on every update


def test_server_rollout_batch_layout_and_seeded_reproducibility(linked):
    handle, prompts = linked["handle"], linked["prompts"]
    seeded = DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": 123})
    first, second = handle.generate(seeded), handle.generate(seeded)
    assert len(first) == 2 * len(PROMPTS) and first.meta_info["temperature"] == 1.0
    assert torch.equal(first.batch["responses"], second.batch["responses"])
    assert list(first.non_tensor_batch["uid"]) == [f"p{i // 2}" for i in range(2 * len(PROMPTS))]
    lengths = first.batch["response_mask"].sum(-1)
    assert torch.equal(first.batch["attention_mask"][:, -8:].sum(-1), lengths)
    greedy = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"do_sample": False}))
    assert len(greedy) == len(PROMPTS)


def test_the_lean_route_returns_what_openai_completions_return(linked):
    """/verl_like/generate (no detokenization, flat log-probs, base64 arrays) against vLLM's /v1/completions on
    the same server, prompt and seed: the same tokens, the same log-probs; a bad field is refused naming it."""
    from verl_like.rollout.base import SamplingConfig
    from verl_like.rollout.server_generate import ROUTE

    address = linked["handle"].servers.clients[0].address
    lean, openai = ServerClient(address, "lean"), ServerClient(address, "openai")
    openai._lean = False
    assert lean.lean and lean.request("GET", ROUTE) == {"version": 1}
    params = SamplingConfig(n=3, max_tokens=8, temperature=1.0, ignore_eos=True, seed=7).vllm_fields(0)
    prompt = linked["prompts"].batch["input_ids"][0][linked["prompts"].batch["attention_mask"][0].bool()].tolist()
    try:
        got, want = lean.complete(prompt, params), openai.complete(prompt, params)
        assert [c.token_ids for c in got] == [c.token_ids for c in want] and len(got) == 3
        assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in got)
        for a, b in zip(got, want):
            assert a.log_probs == pytest.approx(b.log_probs, abs=1e-6)  # float32 on the wire, JSON floats there
        with pytest.raises(ServerError, match=r"HTTP 400.*unknown sampling fields \['best_of'\]"):
            lean.request("POST", ROUTE, json={"prompt_token_ids": prompt, "params": {"best_of": 2}})
    finally:
        lean.close()
        openai.close()


def test_the_lean_route_rescores_or_skips_the_log_probs_when_asked(linked):
    """SamplingConfig.log_probs_from=rescore: the server decodes without log-probs, then scores every finished
    sample as a prompt; log_probs=False: it returns none and the batch has no rollout_log_probs column. The seeded
    samples are the same in all three; the rescored log-probs are the decode's (fp32). An unknown mode is refused."""
    import dataclasses

    from verl_like.rollout.base import SamplingConfig
    from verl_like.rollout.server_generate import ROUTE

    servers, prompts = linked["handle"].servers, linked["prompts"]
    sampling = SamplingConfig(n=2, max_tokens=8, seed=9)
    decoded = servers.generate(prompts, sampling)
    rescored = servers.generate(prompts, dataclasses.replace(sampling, log_probs_from="rescore"))
    skipped = servers.generate(prompts, dataclasses.replace(sampling, log_probs=False))
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(decoded.batch[key], rescored.batch[key]) and torch.equal(decoded.batch[key],
                                                                                    skipped.batch[key]), key
    assert "rollout_log_probs" not in skipped.batch.keys()
    mask = rescored.batch["response_mask"].bool()
    got, want = rescored.batch["rollout_log_probs"], decoded.batch["rollout_log_probs"]
    assert (got[~mask] == 0).all() and float((got - want).abs()[mask].max()) <= 1e-5
    prompt = prompts.batch["input_ids"][0][prompts.batch["attention_mask"][0].bool()].tolist()
    with pytest.raises(ServerError, match=r"HTTP 400.*log_probs='sometimes' is not one of"):
        servers.clients[0].request("POST", ROUTE, json={"prompt_token_ids": prompt, "params": {"max_tokens": 2},
                                                        "log_probs": "sometimes"})
    with pytest.raises(ServerError, match=r"HTTP 400.*'rescore' gives temperature-1 log-probs.*temperature=0\.7"):
        servers.clients[0].request("POST", ROUTE, json={"prompt_token_ids": prompt, "log_probs": "rescore",
                                                        "params": {"max_tokens": 2, "temperature": 0.7}})


def test_a_dead_server_is_named_in_the_error(linked):
    client = ServerClient("http://127.0.0.1:9", "server 3", timeout_s=5)  # nothing listens on port 9
    with pytest.raises(ServerError, match=r"server 3 \(http://127.0.0.1:9\): (GET|POST) /[\w/]+ failed: ConnectError"):
        ServerGenerator([client], pad_token_id=0).generate(linked["prompts"], sampling_config(linked["handle"].config))
