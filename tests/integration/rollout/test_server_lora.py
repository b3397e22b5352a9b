"""Adapter-only LoRA sync into a real vLLM server on CPU (the session's `vllm_lora_server`, `python -m verl_like.serve
... --enable-lora`): the trainer's rank-0 side (`AdapterPublisher`, resharding/transports/server_adapter.py) posts a
PEFT adapter's tensors; the server builds it in memory (rollout/server_lora.py).

After a sync the server's log-probs equal the PEFT model's (fp32) and differ from the base; a second version
replaces the first under a new name; names are never reused; an add one server refuses leaves the old version
active everywhere and names the server and the adapter; requests without an adapter are refused; the sync check
scores under the adapter and names server and adapter when they disagree. A 2-rank LoRA actor group on Ray sends the
base once and then its adapter, every rank counting the bytes, and the server serves its policy.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from verl_like.protocol import DataProto  # noqa: E402
from verl_like.resharding.transports.server_adapter import AdapterPublisher  # noqa: E402
from verl_like.rollout import server_lora, sync_check  # noqa: E402
from verl_like.rollout.server_client import ServerClient, ServerError  # noqa: E402

RANK = 8


class PeftPolicy:
    """A PEFT LoRA policy on the warm-start model with random (non-zero) adapter weights; the trainer's side of the
    sync check (`forward` in TrainEngine's shape)."""

    def __init__(self, model_path: str) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=32, target_modules="all-linear")).eval()
        config = self.model.peft_config["default"].to_dict()
        self.config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}

    def randomize(self, seed: int) -> dict[str, torch.Tensor]:
        """New adapter weights; their PEFT saved tensors."""
        from peft.utils import get_peft_model_state_dict

        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        return {key: tensor.clone() for key, tensor in get_peft_model_state_dict(self.model).items()}

    def log_probs(self, token_ids: list[int], adapter: bool = True) -> torch.Tensor:
        """Log-prob of each token 1.. given the tokens before it (temperature 1)."""
        ids = torch.tensor([token_ids])
        with torch.no_grad():
            if adapter:
                logits = self.model(ids).logits[0]
            else:
                with self.model.disable_adapter():
                    logits = self.model(ids).logits[0]
        return torch.log_softmax(logits[:-1].double(), -1).gather(1, ids[0, 1:, None])[:, 0]

    def forward(self, batch: DataProto, temperature: float) -> DataProto:
        start = batch.batch["input_ids"].shape[1] - batch.batch["responses"].shape[1]
        scored = self.log_probs(batch.batch["input_ids"][0].tolist())[start - 1:]
        return DataProto.from_dict(tensors={"log_probs": scored.float().unsqueeze(0)})


@pytest.fixture(scope="module")
def lora(vllm_lora_server, warmstart_model):
    client = ServerClient(vllm_lora_server, "server 0", timeout_s=120)
    policy = PeftPolicy(warmstart_model)
    publisher = AdapterPublisher([client], RANK, timeout_s=120)
    probe = sync_check.probe_token_ids(policy.model.config.vocab_size)
    yield dict(client=client, policy=policy, publisher=publisher, probe=probe)
    publisher.close()
    client.close()


def served(client: ServerClient, token_ids: list[int], name: str) -> torch.Tensor:
    return torch.tensor(server_lora.score_prompt(client, token_ids, name, 1), dtype=torch.float64)


def test_after_an_adapter_sync_the_server_serves_the_peft_policy_not_the_base(lora):
    client, policy, probe = lora["client"], lora["policy"], lora["probe"]
    name = lora["publisher"].publish(policy.randomize(1), policy.config, version=1)
    assert server_lora.adapter_status(client)["active"] == name
    scores = served(client, probe, name)
    assert (scores - policy.log_probs(probe)).abs().max() <= 1e-5
    assert (scores - policy.log_probs(probe, adapter=False)).abs().max() > 1e-1
    # Generation on the lean route carries the adapter: the sampled tokens' log-probs are the PEFT model's.
    client.lora_name = name
    sample = client.complete(probe[:6], {"n": 1, "max_tokens": 8, "temperature": 1.0, "seed": 3})[0]
    expected = policy.log_probs(probe[:6] + sample.token_ids)[5:]
    assert torch.tensor(sample.log_probs, dtype=torch.float64).sub(expected).abs().max() <= 1e-5


def test_a_second_version_replaces_the_first_under_a_new_name_never_reused(lora):
    client, policy, probe, publisher = lora["client"], lora["policy"], lora["probe"], lora["publisher"]
    first = publisher.publish(policy.randomize(2), policy.config, version=2)
    second = publisher.publish(policy.randomize(3), policy.config, version=3)
    assert first != second and second.endswith("-v3")
    status = server_lora.adapter_status(client)
    assert status["active"] == second and first in status["loaded"] and len(status["loaded"]) <= 3
    assert (served(client, probe, second) - policy.log_probs(probe)).abs().max() <= 1e-5
    reused = server_lora.adapter_payload(policy.randomize(3), policy.config, first, 99, 9)
    with pytest.raises(ServerError, match=f"adapter name '{first}' was used before"):
        server_lora.add_adapter(client, reused)


def test_a_refused_add_leaves_the_old_version_active_on_every_server(lora, caplog):
    """Two clients of the one server stand for two servers: the second add of the same name is refused."""
    client, policy, probe = lora["client"], lora["policy"], lora["probe"]
    old = server_lora.adapter_status(client)["active"]
    twice = AdapterPublisher([client, ServerClient(client.address, "server 1", timeout_s=120)], RANK, 120)
    try:
        # Both adds run at once: whichever reaches the server second is refused.
        with pytest.raises(ServerError, match=rf"server (\d) \(.*\) \(server index \1\) refused adapter "
                                              rf"policy-\d+-v4 .*every server keeps serving {old}"):
            twice.publish(policy.randomize(4), policy.config, version=4)
    finally:
        twice.close()
    status = server_lora.adapter_status(client)
    assert status["active"] == old and not any(name.endswith("-v4") for name in status["loaded"])
    assert "removing the refused adapter" not in caplog.text  # the engine dropped it where it had been added
    policy.randomize(3)  # the active version's weights
    assert (served(client, probe, old) - policy.log_probs(probe)).abs().max() <= 1e-5


def test_requests_without_an_adapter_are_refused_on_a_lora_server(lora):
    client = lora["client"]
    bare = ServerClient(client.address, "bare client")
    with pytest.raises(ServerError, match="a request without lora_name is refused"):
        bare.complete(lora["probe"][:4], {"n": 1, "max_tokens": 2})
    with pytest.raises(ServerError, match="refused on a LoRA server"):
        bare.request("POST", "/v1/completions", json={"model": bare.model, "prompt": [1, 2], "max_tokens": 1})
    bare.close()


def test_a_server_started_without_lora_is_refused_at_link_time_naming_it(vllm_server):
    """The session's plain server (a user's server at rollout.server.address without --enable-lora)."""
    from verl_like.resharding.transports.server_adapter import check_lora_servers

    plain = ServerClient(vllm_server, "server 0")
    with pytest.raises(ServerError, match=r"server 0 \(http://127.0.0.1:\d+\) serves no LoRA adapters .*--enable-lora"):
        check_lora_servers([plain], RANK, window=2)
    plain.close()


def test_the_sync_check_scores_under_the_adapter_and_names_server_and_adapter(lora):
    client, policy = lora["client"], lora["policy"]
    relinked = AdapterPublisher([client], RANK, timeout_s=120)  # takes the next id unused on the server
    name = relinked.publish(policy.randomize(5), policy.config, version=5)
    relinked.close()
    vocab = policy.model.config.vocab_size
    gaps = sync_check.check_servers(policy, [client], 1e-3, 5, vocab, 128, adapter=name)
    assert gaps["rollout/sync_check_gap"] < 1e-5
    policy.randomize(6)  # the trainer moved on; the server was not synced
    with pytest.raises(sync_check.SyncCheckError, match=rf"server 0 \(.*\) \(server index 0, adapter {name}\)"):
        sync_check.check_servers(policy, [client], 1e-3, 6, vocab, 128, adapter=name)


def test_a_lora_actor_group_syncs_the_base_once_then_its_adapter_counted_on_every_rank(
        ray_cluster, vllm_lora_server, warmstart_model):
    """A 2-rank FSDP2 LoRA actor on Ray linked to the server (ServerAdapterTransport): the link sends the base and
    the adapter, every later sync the adapter alone, each rank reporting the sync's bytes (the mean is not halved);
    the server's sampled log-probs then equal the actor's."""
    from batch_helpers import prompt_batch
    from transformers import AutoTokenizer

    from verl_like.config.actor import ActorConfig, OptimConfig
    from verl_like.config.model import ModelConfig
    from verl_like.config.rollout import RolloutConfig, RolloutServerConfig
    from verl_like.rollout.servers import ServerGenerator
    from verl_like.single_controller import ResourcePool, RoleSpec, WorkerGroup
    from verl_like.trainer.rollout_handle import ServerRolloutHandle
    from verl_like.workers.actor_rollout import ActorRolloutWorker

    actor = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4,
                        optim=OptimConfig(lr=5e-2, weight_decay=0.0))
    rollout = RolloutConfig(mode="server", server=RolloutServerConfig(address=(vllm_lora_server,)), dtype="float32",
                            prompt_length=32, response_length=8, n=2, temperature=1.0)
    model = ModelConfig(path=warmstart_model, lora_rank=RANK, lora_alpha=32)
    pool = ResourcePool.create([2], device="cpu", cpus_per_process=1.0, name="server_lora_test")
    group = WorkerGroup(pool, RoleSpec(ActorRolloutWorker, (warmstart_model, actor, rollout), {"model": model}),
                        name="server_lora")
    tokenizer = AutoTokenizer.from_pretrained(warmstart_model)
    servers = ServerGenerator([ServerClient(vllm_lora_server, "server 0")], tokenizer.pad_token_id)
    handle = ServerRolloutHandle(rollout, group, servers, serves_adapters=True)
    try:
        group.init_model()
        linked = group.connect_rollout_servers([vllm_lora_server])
        adapter_bytes = linked[0]["sync/adapter_bytes"]
        base = base_parameter_count(warmstart_model)
        assert adapter_bytes == 131072  # rank 8 on every Linear of the tiny model, fp32
        for rank in linked:  # each rank: the base once, plus the adapter
            assert rank["sync/base_bytes"] == 4 * base and rank["sync/bytes"] == 4 * base + adapter_bytes
        prompts = prompt_batch(tokenizer, ["sort 4021", "sort 973", "sort 51820", "sort 660"])
        batch = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": 11}))
        old = group.compute_log_prob(batch)
        old.meta_info.pop("metrics", None)
        batch = batch.union(old)
        batch.batch["advantages"] = torch.tensor([1.0, -1.0]).repeat(4).unsqueeze(1) * batch.batch["response_mask"]
        group.update_actor(batch)
        synced = handle.sync_weights()
        assert [rank["sync/bytes"] for rank in synced] == [adapter_bytes, adapter_bytes]
        assert synced[0]["rollout/sync_check_gap"] < 1e-5
        name = servers.clients[0].lora_name
        assert name.endswith("-v1") and server_lora.adapter_status(servers.clients[0])["active"] == name
        fresh = handle.generate(DataProto(prompts.batch, prompts.non_tensor_batch, {"seed": 12}))
        scored = group.compute_log_prob(fresh)
        mask = fresh.batch["response_mask"].bool()
        assert float((fresh.batch["rollout_log_probs"] - scored.batch["old_log_probs"]).abs()[mask].max()) <= 1e-5
    finally:
        servers.close()
        group.close()
        group.shutdown()
        pool.remove()


def base_parameter_count(model_path: str) -> int:
    """The base model's parameter count."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_path).parameters())
