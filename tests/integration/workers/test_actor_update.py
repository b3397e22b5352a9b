"""PPOActor and ReferencePolicy on a real 2-rank WorkerGroup (gloo, fp32, tiny Qwen2).

Two ranks must give what one process gives on the whole batch: the same updated weights and metrics, with
micro-batches, with dynamic packed micro-batches, and with 2 shuffled mini-batches x 2 epochs. Independently,
the first mini-batch's gradient must equal the autograd gradient of the PPO loss written out in plain float64
code. Each rank also builds a 1-rank mesh of its own, so the one-process runs happen in the same Ray actors.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from types import SimpleNamespace

import pytest
import ray
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from transformers import AutoConfig, AutoModelForCausalLM

from verl_like.algorithms import compute_rollout_is_weights
from verl_like.config.actor import ActorConfig, FSDPConfig, OptimConfig, PolicyLossOptions
from verl_like.config.loss_options import RolloutISConfig
from verl_like.config.model import RefConfig
from verl_like.engine.fsdp import FSDPEngine
from verl_like.engine.from_config import actor_engine_config, reference_engine_config
from verl_like.models.tiny import build_tiny_model
from verl_like.protocol import DataProto
from verl_like.single_controller import Dispatch, ResourcePool, RoleSpec, Worker, WorkerGroup, register
from verl_like.single_controller.errors import WorkerError
from verl_like.workers.actor import PPOActor
from verl_like.workers.ppo_update import epoch_order
from verl_like.workers.reference import ReferencePolicy
from verl_like.workers.train_request import ROLLOUT_IS_KEY

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules

PROMPT_LEN, RESPONSE_LEN, ROWS, TEMPERATURE = 5, 6, 8, 0.8
# Adam's step is lr * m / (sqrt(v) + eps): a larger eps keeps float32-vs-float32 comparisons well-posed where a
# gradient entry is ~0 (see tests/integration/engine).
OPTIM = OptimConfig(lr=1e-3, eps=1e-5, weight_decay=0.0)


def _config(**overrides) -> ActorConfig:
    base = dict(
        ppo_mini_batch_size=ROWS, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2, entropy_coeff=0.01,
        use_kl_loss=True, kl_loss_coef=0.1, optim=OPTIM,
    )
    return ActorConfig(**{**base, **overrides})


class RecordingEngine(FSDPEngine):
    """An FSDPEngine that keeps the full gradient of its first optimizer step (a collective, like the step)."""

    first_grads: dict[str, torch.Tensor] | None = None

    def optimizer_step(self, lr_scale: float = 1.0) -> float:
        if self.first_grads is None:
            self.first_grads = {
                name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                for name, p in self.model.named_parameters()
            }
        return super().optimizer_step(lr_scale)


class PolicyHost(Worker):
    """Hosts PPOActor / ReferencePolicy on the group's mesh, or on a 1-rank mesh of its own (`solo`)."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.init_distributed(timeout_s=120)
        singles = [dist.new_group([rank]) for rank in range(self.world_size)]  # collective: every rank makes all
        self.solo_mesh = DeviceMesh.from_group(singles[self.rank], "cpu", mesh_dim_names=("dp",))
        config = _config()
        self.actor = PPOActor(FSDPEngine(actor_engine_config(config, self.model_dir)), config, rollout_n=1)
        reference = reference_engine_config(actor_engine_config(config, self.model_dir))
        self.reference = ReferencePolicy(FSDPEngine(reference))

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO)
    def log_probs(self, batch: DataProto) -> DataProto:
        actor = self.actor.compute_log_prob(batch, temperature=TEMPERATURE, calculate_entropy=True)
        return actor.union(self.reference.compute_ref_log_prob(batch))  # temperature from meta_info

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def reference_refusals(self, batch: DataProto) -> dict[str, str]:
        engine, errors = self.reference.engine, {}
        for name, call in (
            ("forward_backward", lambda: engine.forward_backward(batch, lambda o, m: (o["log_probs"].sum(), {}))),
            ("optimizer_step", engine.optimizer_step),
            ("current_lr", lambda: engine.current_lr),
            ("save_checkpoint", lambda: engine.save_checkpoint("/never/written")),
        ):
            try:
                call()
                errors[name] = "no error"
            except RuntimeError as exc:
                errors[name] = str(exc)
        return errors

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def update(
        self, batch: DataProto, config: ActorConfig, rollout_n: int, solo: bool, orders: list | None = None
    ) -> dict:
        """Full batch in; DP runs use this rank's chunk, solo runs the whole batch once per entry of `orders`."""
        engine = RecordingEngine(actor_engine_config(config, self.model_dir), self.solo_mesh if solo else None)
        actor = PPOActor(engine, config, rollout_n)
        if solo:
            metrics = [actor.update_policy(batch[order] if order is not None else batch) for order in orders or [None]]
        else:
            metrics = [actor.update_policy(batch.chunk(self.world_size)[self.rank])]
        weights = {name: tensor.clone() for name, tensor in engine.full_state_iterator()}
        keep = solo or self.rank == 0
        return {"metrics": metrics, "weights": weights if keep else None, "first_grads": engine.first_grads}


def _ppo_batch(vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of varied lengths (pad id 0), advantages, IS weights."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = [5, 1, 3, 4, 2, 5, 3, 1]
    response_lens = [6, 2, 4, 1, 6, 3, 5, 2]
    input_ids = torch.zeros(ROWS, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        span = slice(PROMPT_LEN - p, PROMPT_LEN + r)
        input_ids[row, span] = torch.randint(3, vocab_size, (p + r,), generator=gen)
        attention_mask[row, span] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, PROMPT_LEN:],
        "response_mask": attention_mask[:, PROMPT_LEN:],
        "advantages": torch.randn(ROWS, RESPONSE_LEN, generator=gen),
        "rollout_is_weights": 0.5 + torch.rand(ROWS, RESPONSE_LEN, generator=gen),
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("actor_models") / "tiny"))


@pytest.fixture(scope="module")
def host(ray_cluster, model_dir):
    pool = ResourcePool.create([2], device="cpu", cpus_per_process=0.5, name="actor_update_test")
    group = WorkerGroup(pool, RoleSpec(PolicyHost, (model_dir,)), name="actor_update_test")
    group.setup()
    yield group
    group.shutdown()
    pool.remove()


@pytest.fixture(scope="module")
def log_probs(host, model_dir) -> DataProto:
    tensors = _ppo_batch(AutoConfig.from_pretrained(model_dir).vocab_size, seed=0)
    return host.log_probs(DataProto.from_dict(tensors=tensors, meta_info={"temperature": TEMPERATURE}))


@pytest.fixture(scope="module")
def batch(model_dir, log_probs) -> DataProto:
    """A batch whose old and reference log-probs sit around the current ones, so ratios leave the clip range."""
    tensors = _ppo_batch(AutoConfig.from_pretrained(model_dir).vocab_size, seed=0)
    gen = torch.Generator().manual_seed(1)
    current = log_probs.batch["old_log_probs"]
    tensors["old_log_probs"] = current + 0.3 * torch.randn(current.shape, generator=gen)
    tensors["ref_log_probs"] = current + 0.2 * torch.randn(current.shape, generator=gen)
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": TEMPERATURE})


def _assert_same_update(dp_result: dict, solo_metrics: dict, solo_weights: dict) -> None:
    dp_metrics = dp_result["metrics"][0]
    assert dp_metrics.keys() == solo_metrics.keys()
    for name, value in solo_metrics.items():
        assert dp_metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for name, expected in solo_weights.items():
        torch.testing.assert_close(dp_result["weights"][name], expected, atol=2e-6, rtol=0, msg=name)


def _run_both(host, batch, config, solo_config=None, orders=None, rollout_n=1) -> tuple[list[dict], list[dict]]:
    dp = host.update(batch, config, rollout_n, solo=False)
    solo = host.update(batch, solo_config or config, rollout_n, solo=True, orders=orders)
    for name, tensor in solo[0]["weights"].items():  # both ranks ran the same one-process update
        assert torch.equal(tensor, solo[1]["weights"][name]), name
    return dp, solo


def test_reference_log_probs_equal_the_actors_before_any_update(log_probs):
    torch.testing.assert_close(log_probs.batch["ref_log_probs"], log_probs.batch["old_log_probs"], atol=0, rtol=0)
    mask = log_probs.batch["old_log_probs"] != 0
    assert mask.sum() > 20  # real values, not zeros
    assert log_probs.batch["entropy"][mask].min() > 0


def test_reference_engine_refuses_to_train(host, batch):
    for errors in host.reference_refusals(batch.chunk(2)[0]):
        assert errors.keys() == {"forward_backward", "optimizer_step", "current_lr", "save_checkpoint"}
        for message in errors.values():
            assert "inference_only=True" in message


def test_micro_batches_on_two_ranks_equal_one_process(host, batch):
    # One mini-batch: 4 prompts x rollout.n=2 = all 8 samples.
    dp, solo = _run_both(host, batch, _config(ppo_mini_batch_size=4), rollout_n=2)
    _assert_same_update(dp[0], solo[0]["metrics"][0], solo[0]["weights"])
    metrics = dp[0]["metrics"][0]
    assert dp[1]["metrics"] == dp[0]["metrics"]  # the same metrics on every rank
    assert metrics["actor/pg_clipfrac"] > 0  # the perturbed old log-probs push ratios out of the clip range
    assert metrics["actor/kl_loss"] > 0 and metrics["actor/kl_coef"] == 0.1
    assert metrics["actor/lr"] == pytest.approx(1e-3)
    assert {"actor/entropy", "actor/ppo_kl", "actor/is_weight_mean", "actor/grad_norm"} <= metrics.keys()


def test_dynamic_packed_gspo_on_two_ranks_equals_one_process(host, batch):
    config = _config(
        ppo_micro_batch_size_per_gpu=None, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=16,
        use_remove_padding=True, policy_loss=PolicyLossOptions("gspo"), loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=10.0,
        clip_ratio_low=0.1, clip_ratio_high=0.3, entropy_coeff=0.0, kl_loss_type="k2", grad_clip=None,
    )
    dp, solo = _run_both(host, batch, config)
    _assert_same_update(dp[0], solo[0]["metrics"][0], solo[0]["weights"])
    assert "actor/entropy" not in dp[0]["metrics"][0]  # entropy_coeff == 0: not computed


def test_shuffled_mini_batches_and_epochs_on_two_ranks_equal_one_process(host, batch):
    """2 mini-batches x 2 epochs, shuffled. One process reproduces the ranks' mini-batches (each rank permutes
    its own rows with the shared permutation) by running one unshuffled epoch per permuted order."""
    config = _config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, ppo_epochs=2, shuffle=True,
                     data_loader_seed=5, loss_agg_mode="seq-mean-token-mean", use_kl_loss=False)
    batch = batch.select(batch_keys=[key for key in batch.batch.keys() if key != "rollout_is_weights"])
    solo_config = dataclasses.replace(config, ppo_epochs=1, shuffle=False)
    per_rank, orders = ROWS // 2, []
    for epoch in range(2):
        local = epoch_order(per_rank, shuffle=True, seed=5, step=0, epoch=epoch)
        assert not torch.equal(local, torch.arange(per_rank))
        halves = [local[:2], local[2:]]  # the rank-local mini-batches, the same on both ranks
        orders.append(torch.cat([rank * per_rank + half for half in halves for rank in range(2)]))
    dp, solo = _run_both(host, batch, config, solo_config, orders)
    per_epoch = solo[0]["metrics"]
    averaged = {name: (per_epoch[0][name] + per_epoch[1][name]) / 2 for name in per_epoch[0]}
    _assert_same_update(dp[0], averaged, solo[0]["weights"])
    assert not {"actor/kl_loss", "actor/kl_coef", "actor/is_weight_mean"} & dp[0]["metrics"][0].keys()


def test_lr_scale_in_meta_info_steps_as_a_proportionally_lower_learning_rate(host, batch):
    """meta_info["lr_scale"] (the asynchronous driver's staleness scaling) on 2 ranks equals one process whose
    configured lr is that much lower: the same weights after the step, and actor/lr logs the rate used."""
    config = _config(ppo_mini_batch_size=4)  # x rollout.n=2: one mini-batch of all 8 samples
    scaled = DataProto(batch.batch, batch.non_tensor_batch, {**batch.meta_info, "lr_scale": 0.25})
    dp = host.update(scaled, config, 2, solo=False)
    lower = _config(ppo_mini_batch_size=4, optim=dataclasses.replace(OPTIM, lr=OPTIM.lr * 0.25))
    solo = host.update(batch, lower, 2, solo=True)
    _assert_same_update(dp[0], solo[0]["metrics"][0], solo[0]["weights"])
    assert dp[0]["metrics"][0]["actor/lr"] == pytest.approx(0.25e-3)
    unscaled = host.update(batch, config, 2, solo=False)
    full, quarter = unscaled[0]["weights"], solo[0]["weights"]
    assert max(float((full[name] - quarter[name]).abs().max()) for name in quarter) > 1e-4  # not vacuous


def test_update_without_old_log_probs_equals_the_recomputed_update(host, batch, log_probs):
    """recompute_old_log_prob=false (one optimizer step over the batch): the update takes its own forward's
    log-probs as the old ones. On 2 ranks it must give the weights of the update fed the recomputed old log-probs,
    and report the rollout-vs-trainer gap compute_log_prob reports, reduced over both ranks (mean and max)."""
    current = log_probs.batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    gen = torch.Generator().manual_seed(2)
    rollout = torch.where(mask, current + 0.05 * torch.randn(current.shape, generator=gen), 0.0)
    rollout[ROWS - 1, 0] = current[ROWS - 1, 0] + 0.5  # the largest gap sits on rank 1's rows
    on_policy = {key: batch.batch[key] for key in batch.batch.keys() if key != "old_log_probs"}
    recomputed = DataProto.from_dict(tensors={**on_policy, "old_log_probs": current}, meta_info=batch.meta_info)
    from_update = DataProto.from_dict(tensors={**on_policy, "rollout_log_probs": rollout}, meta_info=batch.meta_info)
    expected = host.update(recomputed, _config(ppo_mini_batch_size=4), 2, solo=False)
    config = _config(ppo_mini_batch_size=4, recompute_old_log_prob=False)
    dp, solo = _run_both(host, from_update, config, rollout_n=2)
    _assert_same_update(dp[0], solo[0]["metrics"][0], solo[0]["weights"])
    for name, tensor in expected[0]["weights"].items():
        torch.testing.assert_close(dp[0]["weights"][name], tensor, atol=2e-6, rtol=0, msg=name)
    metrics, reference = dp[0]["metrics"][0], expected[0]["metrics"][0]
    assert metrics["actor/pg_loss"] == pytest.approx(reference["actor/pg_loss"], rel=1e-5, abs=1e-6)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    gap = (rollout.double() - current.double()).abs()[mask]
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(float(gap.mean()), rel=1e-4)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.5, rel=1e-4)
    assert not any(name.startswith("actor/logprob_diff") for name in metrics)
    with pytest.raises(WorkerError, match=r"lacks \['old_log_probs'\]"):  # auto/true still needs them
        host.update(from_update, _config(ppo_mini_batch_size=4), 2, solo=False)

    # algorithm.rollout_is: the update computes the IS weights from its forward, as the driver does from the
    # recomputed old log-probs (token level, truncated at 1.03 so that some weights are cut).
    is_config = RolloutISConfig(level="token", mode="truncate", threshold=1.03)
    weights, is_metrics = compute_rollout_is_weights(current, rollout, batch.batch["response_mask"], is_config)
    assert 0 < float(is_metrics["rollout_is/clipped_frac"]) < 1
    plain = {key: value for key, value in on_policy.items() if key != "rollout_is_weights"}
    driver = DataProto.from_dict(tensors={**plain, "old_log_probs": current, "rollout_is_weights": weights},
                                 meta_info=batch.meta_info)
    in_update = DataProto.from_dict(tensors={**plain, "rollout_log_probs": rollout},
                                    meta_info={**batch.meta_info, ROLLOUT_IS_KEY: is_config})
    expected = host.update(driver, _config(ppo_mini_batch_size=4), 2, solo=False)
    got = host.update(in_update, config, 2, solo=False)
    for name, tensor in expected[0]["weights"].items():
        torch.testing.assert_close(got[0]["weights"][name], tensor, atol=2e-6, rtol=0, msg=name)
    metrics = got[0]["metrics"][0]
    assert metrics["actor/is_weight_mean"] == pytest.approx(expected[0]["metrics"][0]["actor/is_weight_mean"], rel=1e-4)
    for name, value in is_metrics.items():
        assert metrics[name] == pytest.approx(float(value), rel=1e-4, abs=1e-6), name


def _float64_ppo_loss(model, batch: dict[str, torch.Tensor], rows: list[int], config: ActorConfig) -> torch.Tensor:
    """The token-mean PPO loss (dual clip, IS weights, entropy bonus, k3 KL loss), one token at a time."""
    low, high, dual = config.clip_ratio, config.clip_ratio, config.clip_ratio_c
    terms, count = [], 0
    for row in rows:
        valid = batch["attention_mask"][row].bool()
        ids = batch["input_ids"][row][valid]
        prompt = int(valid[:PROMPT_LEN].sum())
        logits = model(input_ids=ids[None]).logits[0].double() / TEMPERATURE
        for t in range(int(batch["response_mask"][row].sum())):
            log_p = torch.log_softmax(logits[prompt - 1 + t], dim=-1)
            log_prob = log_p[ids[prompt + t]]
            ratio = torch.exp(log_prob - float(batch["old_log_probs"][row, t]))
            adv = float(batch["advantages"][row, t])
            surrogate = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
            if adv < 0:
                surrogate = torch.minimum(surrogate, torch.tensor(-adv * dual, dtype=torch.float64))
            surrogate = surrogate * float(batch["rollout_is_weights"][row, t])
            entropy = -(log_p.exp() * log_p).sum()
            d = float(batch["ref_log_probs"][row, t]) - log_prob  # k3 = e^d - d - 1
            kl = torch.exp(d) - d - 1
            terms.append(surrogate - config.entropy_coeff * entropy + config.kl_loss_coef * kl)
            count += 1
    return torch.stack(terms).sum() / count


def test_first_mini_batch_gradient_equals_a_float64_reference(host, batch, model_dir):
    config = _config(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1)
    dp = host.update(batch, config, 2, solo=False)  # 2 prompts x n=2: mini-batches of 4 samples
    # Unshuffled, mini-batch 0 is rows 0-1 of each rank's half of the batch.
    first_rows = [0, 1, ROWS // 2, ROWS // 2 + 1]
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64, attn_implementation="eager")
    loss = _float64_ppo_loss(model, dict(batch.batch.items()), first_rows, config)
    loss.backward()
    grads = dp[0]["first_grads"]
    norm = math.sqrt(sum(float(p.grad.square().sum()) for p in model.parameters()))
    assert grads.keys() == {name for name, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name].double(), param.grad, atol=1e-6 * norm, rtol=1e-4, msg=name)
    assert dp[0]["metrics"][0]["actor/grad_norm"] > 0
    assert torch.equal(dp[0]["first_grads"]["lm_head.weight"], dp[1]["first_grads"]["lm_head.weight"])


def _with_zero_advantages(batch: DataProto, rows: list[int]) -> DataProto:
    advantages = batch.batch["advantages"].clone()
    advantages[rows] = 0.0
    tensors = {key: batch.batch[key] for key in batch.batch.keys() if key != "advantages"}
    return DataProto.from_dict(tensors={**tensors, "advantages": advantages}, meta_info=batch.meta_info)


def test_rows_with_zero_advantage_run_no_forward_and_the_update_is_the_same(host, batch, model_dir):
    """skip_zero_advantage_rows (no entropy bonus, no KL loss): rows whose advantage is 0 everywhere are left out
    of the forward and backward, but the loss still divides by all the mini-batch's tokens, so the gradient is
    the float64 one of the whole mini-batch and the weights are those of the update that trains every row, on 2
    ranks and in one process. Rank 0 marks 1 row and rank 1 three: rank 0 fills up with 2 unmarked rows."""
    zeroed = _with_zero_advantages(batch, [1, 2, 3, 6])
    config = _config(ppo_mini_batch_size=4, entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0,
                     ppo_micro_batch_size_per_gpu=None, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=12,
                     use_remove_padding=True)
    every_row = dataclasses.replace(config, skip_zero_advantage_rows=False)
    dp, solo = _run_both(host, zeroed, config, rollout_n=2)
    full = host.update(zeroed, every_row, 2, solo=False)
    assert dp[0]["metrics"][0]["actor/skipped_row_frac"] == 0.25  # 3 of each rank's 4 rows train
    assert solo[0]["metrics"][0]["actor/skipped_row_frac"] == 0.5  # one process trains rows 0, 4, 5, 7
    assert "actor/skipped_row_frac" not in full[0]["metrics"][0]
    for name in ("actor/pg_loss", "actor/grad_norm"):
        for got in (dp[0]["metrics"][0][name], solo[0]["metrics"][0][name]):
            assert got == pytest.approx(full[0]["metrics"][0][name], rel=1e-5, abs=1e-7), name
    for name, expected in full[0]["weights"].items():
        torch.testing.assert_close(dp[0]["weights"][name], expected, atol=2e-6, rtol=0, msg=name)
        torch.testing.assert_close(solo[0]["weights"][name], expected, atol=2e-6, rtol=0, msg=name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64, attn_implementation="eager")
    _float64_ppo_loss(model, dict(zeroed.batch.items()), list(range(ROWS)), config).backward()
    norm = math.sqrt(sum(float(p.grad.square().sum()) for p in model.parameters()))
    for name, param in model.named_parameters():
        torch.testing.assert_close(dp[0]["first_grads"][name].double(), param.grad, atol=1e-6 * norm, rtol=1e-4,
                                   msg=name)

    # Every row zero: one row per rank runs (a zero gradient, as the full update's), the same weights.
    nothing = _with_zero_advantages(batch, list(range(ROWS)))
    dp = host.update(nothing, config, 2, solo=False)
    unmoved = host.update(nothing, every_row, 2, solo=False)
    assert dp[0]["metrics"][0]["actor/skipped_row_frac"] == 0.75
    assert dp[0]["metrics"][0]["actor/grad_norm"] == unmoved[0]["metrics"][0]["actor/grad_norm"] == 0.0
    for name, expected in unmoved[0]["weights"].items():
        torch.testing.assert_close(dp[0]["weights"][name], expected, atol=0, rtol=0, msg=name)
    assert max(float((full[0]["weights"][name] - tensor).abs().max())  # the first update did move the weights
               for name, tensor in unmoved[0]["weights"].items()) > 1e-4

    # An entropy bonus gives every row a gradient: nothing is left out.
    with_entropy = host.update(zeroed, dataclasses.replace(config, entropy_coeff=0.01), 2, solo=False)
    assert "actor/skipped_row_frac" not in with_entropy[0]["metrics"][0]


def test_update_policy_names_what_the_batch_lacks():
    engine = SimpleNamespace(dp_size=2, global_step=0)  # the checks run before the engine is touched
    tensors = _ppo_batch(vocab_size=50, seed=0)
    tensors["old_log_probs"] = torch.zeros(ROWS, RESPONSE_LEN)
    actor = PPOActor(engine, _config(ppo_mini_batch_size=4), rollout_n=1)
    no_ref = DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})
    with pytest.raises(KeyError, match=r"lacks \['ref_log_probs'\] \(use_kl_loss needs"):
        actor.update_policy(no_ref)
    tensors["ref_log_probs"] = torch.zeros(ROWS, RESPONSE_LEN)
    with pytest.raises(KeyError, match=r"meta_info\['temperature'\] is unset"):
        actor.update_policy(DataProto.from_dict(tensors=tensors))
    uneven = DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})[:3]
    with pytest.raises(ValueError, match=r"holds 3 samples.*share 2 .*actor_rollout_ref\.actor\.ppo_mini_batch_size"):
        actor.update_policy(uneven)


def test_reference_engine_config_drops_the_optimizer(model_dir):
    offloading = FSDPConfig(optimizer_offload=True, param_offload=True)
    actor_engine = actor_engine_config(_config(fsdp_config=offloading), model_dir)
    reference = reference_engine_config(actor_engine)
    assert reference.inference_only and not reference.optimizer_offload and reference.param_offload
    assert dataclasses.replace(reference, inference_only=False, optimizer_offload=True) == actor_engine
    with pytest.raises(ValueError, match=r"optimizer_offload=True but inference_only=True"):
        dataclasses.replace(actor_engine, inference_only=True)


def test_reference_engine_config_applies_the_ref_node(model_dir):
    actor_engine = actor_engine_config(_config(), model_dir)
    ref = RefConfig(
        log_prob_micro_batch_size_per_gpu=3, log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=77,
        fsdp_config=FSDPConfig(model_dtype="bf16", param_dtype="bf16", reduce_dtype="fp32", param_offload=True,
                               offload_policy=True, reshard_after_forward=False),
    )
    reference = reference_engine_config(actor_engine, ref)
    assert reference.inference_only and not reference.optimizer_offload
    assert (reference.micro_batch_size_per_rank, reference.use_dynamic_bsz, reference.max_tokens_per_rank) == (3, True, 77)
    assert (reference.dtype, reference.param_dtype, reference.reduce_dtype) == ("bfloat16", "bfloat16", "float32")
    assert reference.param_offload and reference.offload_policy and not reference.reshard_after_forward
    assert not actor_engine.offload_policy
    assert reference.model_path == actor_engine.model_path and reference.lr == actor_engine.lr
    row_based = reference_engine_config(actor_engine, RefConfig(log_prob_micro_batch_size_per_gpu=5))
    assert (row_based.micro_batch_size_per_rank, row_based.use_dynamic_bsz, row_based.max_tokens_per_rank) == (5, False, None)
