"""What each rank of the 4-process gloo group runs for the Megatron engine tests; results come back by file.

One spawn runs every layout (TP2 x DP2, PP2 x DP2, TP2 x PP2, PP2 x VPP2 x DP2): parallel_state is torn down
and set up again between layouts, which is far cheaper than a spawn (20-45 s of imports for 4 ranks on 2 cores).
A scenario that raises records its error text instead of failing the others.
"""

from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine_reference import TEMPERATURE, make_batch, policy_loss, value_loss
from engine_scenarios import ADAM_EPS, LR, ROWS

WORLD_SIZE = 4
# Adam with eps far above every |gradient| moves each weight by lr * g / (|g| + eps), nearly a gradient step:
# comparing those updates checks the gradients themselves, without Adam's amplification of rounding near g = 0.
SGD_LIKE = {"lr": 1.0, "eps": 10.0, "grad_clip": None}

# name -> (tensor_model_parallel_size, pipeline_model_parallel_size, virtual_pipeline_model_parallel_size)
LAYOUTS = {"tp2": (2, 1, None), "pp2": (1, 2, None), "tp2pp2": (2, 2, None)}
VPP_LAYOUT = ("pp2vpp2", (1, 2, 2))  # needs the 4-layer model

# name -> (model kind, EngineConfig fields)
SCENARIOS = {
    "policy_sgd_like": ("causal_lm", dict(SGD_LIKE, micro_batch_size_per_rank=2)),
    "policy_adam_clipped": ("causal_lm", {"lr": LR, "eps": ADAM_EPS, "micro_batch_size_per_rank": 1}),
    "policy_dynamic_unpadded": (
        "causal_lm",
        dict(SGD_LIKE, use_dynamic_bsz=True, max_tokens_per_rank=20, use_remove_padding=True),
    ),
    "value_sgd_like": ("value", dict(SGD_LIKE, micro_batch_size_per_rank=2)),
}
# The interleaved layout's own: a token budget that holds each rank's rows at once still gives a multiple of the
# pipeline size of micro-batches (megatron-core refuses fewer).
VPP_SCENARIOS = {
    "policy_sgd_like": SCENARIOS["policy_sgd_like"],
    "policy_one_budget": ("causal_lm", dict(SGD_LIKE, use_dynamic_bsz=True, max_tokens_per_rank=10_000)),
}
LOSSES = {"causal_lm": policy_loss, "value": value_loss}


def _rows(batch: dict, dp_rank: int, dp_size: int):
    from verl_like.protocol import DataProto

    rows = slice(dp_rank * ROWS // dp_size, (dp_rank + 1) * ROWS // dp_size)
    return DataProto.from_dict(tensors={key: value[rows] for key, value in batch.items()})


def _engine(model_dir: str, layout: tuple, kind: str, fields: dict):
    from verl_like.config.megatron import MegatronConfig
    from verl_like.engine.config import EngineConfig
    from verl_like.engine.megatron.engine import MegatronEngine

    tp, pp, vpp, *sequence_parallel = layout
    parallel = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              virtual_pipeline_model_parallel_size=vpp, sequence_parallel=bool(sequence_parallel))
    return MegatronEngine(EngineConfig(model_path=model_dir, model_kind=kind, **fields), parallel)


def train_step(ctx, layout, kind, fields):
    from verl_like.engine.megatron import cpu_support

    engine = _engine(ctx["model_dir"], layout, kind, fields)
    local = _rows(ctx["batch"], engine.dp_rank, engine.dp_size)
    forward = engine.forward(local, temperature=TEMPERATURE, calculate_entropy=True)
    cpu_support.SHIM_HITS.clear()
    result = engine.forward_backward(local, LOSSES[kind], temperature=TEMPERATURE)
    grad_norm = engine.optimizer_step()
    shim_hits = dict(cpu_support.SHIM_HITS)
    weights = {name: tensor.clone() for name, tensor in engine.full_state_iterator()}  # a collective
    return {
        "dp_rank": engine.dp_rank,
        "collects_outputs": engine.collects_outputs,
        "outputs": dict(forward.batch.items()),
        "loss": result.loss,
        "metrics": result.metrics,
        "num_micro_batches": result.num_micro_batches,
        "grad_norm": grad_norm,
        "shim_hits": shim_hits,
        "weights": weights if ctx["rank"] == 0 else None,
        "shards": {name: shard.clone() for name, shard in engine.local_weight_shards().items()},
        "holdings": engine.weight_holdings(),
    }


def _step(engine, local) -> float:
    engine.forward_backward(local, policy_loss, temperature=TEMPERATURE)
    return engine.optimizer_step()


def _weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in engine.full_state_iterator()}


def checkpoint_resume(ctx, layout):
    """save, step twice; load, step twice: identical weights; the step count and LR come back too."""
    schedule = {"lr": LR, "eps": ADAM_EPS, "lr_scheduler": "cosine", "warmup_steps": 1, "total_steps": 4,
                "weight_decay": 0.1, "micro_batch_size_per_rank": 2}
    engine = _engine(ctx["model_dir"], layout, "causal_lm", schedule)
    batches = [_rows(make_batch(ROWS, ctx["vocab_size"], seed), engine.dp_rank, engine.dp_size) for seed in (11, 12, 13)]
    _step(engine, batches[0])
    directory = Path(ctx["workdir"]) / f"checkpoint_{'x'.join(map(str, layout))}"
    engine.save_checkpoint(directory)
    draws_after_save = torch.rand(3)
    norms_first = [_step(engine, local) for local in batches[1:]]
    weights_first = _weights(engine)
    torch.manual_seed(1234)
    engine.load_checkpoint(directory)
    draws_after_load = torch.rand(3)
    step_after_load, lr_after_load = engine.global_step, engine.current_lr
    norms_second = [_step(engine, local) for local in batches[1:]]
    weights_second = _weights(engine)
    return {
        "weights_equal": all(torch.equal(weights_first[k], weights_second[k]) for k in weights_first),
        "norms": (norms_first, norms_second),
        "rng_restored": torch.equal(draws_after_save, draws_after_load),
        "step_after_load": step_after_load,
        "lr_after_load": lr_after_load,
        "files": sorted(p.name for p in directory.iterdir()),
        "directory": str(directory),
    }


def other_layout_checkpoint_refused(ctx, layout):
    engine = _engine(ctx["model_dir"], layout, "causal_lm", {"lr": LR})
    try:
        engine.load_checkpoint(Path(ctx["workdir"]) / "checkpoint_2x1xNone")  # written by the tp2 layout
    except ValueError as exc:
        return {"error_text": str(exc)}
    return {"error_text": None}


def export(ctx, layout):
    from transformers import AutoTokenizer

    results = {}
    for kind, model_dir in (("causal_lm", ctx["tied_model_dir"]), ("value", ctx["model_dir"])):
        engine = _engine(model_dir, layout, kind, {"lr": LR, "eps": ADAM_EPS})
        local = _rows(ctx["batch"], engine.dp_rank, engine.dp_size)
        engine.forward_backward(local, LOSSES[kind], temperature=TEMPERATURE)
        engine.optimizer_step()
        directory = Path(ctx["workdir"]) / f"export_{kind}"
        engine.export_hf(directory, AutoTokenizer.from_pretrained(model_dir) if kind == "causal_lm" else None)
        outputs = engine.forward(local, temperature=TEMPERATURE)
        results[kind] = {"directory": str(directory), "outputs": dict(outputs.batch.items()),
                         "dp_rank": engine.dp_rank, "dp_size": engine.dp_size}
    return results


def offload_round_trip(ctx, layout):
    engine = _engine(ctx["model_dir"], layout, "causal_lm", {"lr": LR, "param_offload": True,
                                                             "optimizer_offload": True})
    local = _rows(ctx["batch"], engine.dp_rank, engine.dp_size)
    _step(engine, local)
    before = engine.forward(local)
    engine.offload()
    try:
        engine.forward(local)
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    engine.onload()
    after = engine.forward(local)
    return {"equal": torch.equal(before.batch["log_probs"], after.batch["log_probs"]), "refused": refused,
            "grad_norm_after_onload": _step(engine, local)}


def refusals(ctx, layout):
    """What the engine refuses, with the text it says."""
    errors = {}
    for name, kind, fields, other_layout in (
        ("reward_model", "sequence_classifier", {}, layout),
        ("bfloat16", "causal_lm", {"dtype": "bfloat16"}, layout),
        ("gradient_checkpointing", "causal_lm", {"gradient_checkpointing": True}, layout),
        ("other_sizes_in_one_process", "causal_lm", {}, (4, 1, None)),
        ("sequence_parallel", "causal_lm", {}, (*layout, True)),
    ):
        try:
            _engine(ctx["model_dir"], other_layout, kind, fields)
            errors[name] = None
        except ValueError as exc:
            errors[name] = str(exc)
    return errors


def non_finite_gradient(ctx, layout):
    """A NaN loss: the norm is reported, the update skipped, the step counted."""
    engine = _engine(ctx["model_dir"], layout, "causal_lm", {"lr": LR})
    before = _weights(engine)
    local = _rows(ctx["batch"], engine.dp_rank, engine.dp_size)

    def nan_loss(outputs, micro_batch):
        loss, metrics = policy_loss(outputs, micro_batch)
        return loss * float("nan"), metrics

    engine.forward_backward(local, nan_loss)
    grad_norm = engine.optimizer_step()
    unchanged = all(torch.equal(before[name], tensor) for name, tensor in engine.full_state_iterator())
    grad_norm_next = _step(engine, local)  # the dropped gradients do not leak into the next step
    try:
        engine.optimizer_step(lr_scale=0.0)
        bad_scale = None
    except ValueError as exc:
        bad_scale = str(exc)
    return {"grad_norm": grad_norm, "unchanged": unchanged, "global_step": engine.global_step,
            "grad_norm_next": grad_norm_next, "bad_scale": bad_scale}


def actor_and_reference(ctx, layout):
    """An actor and an inference-only reference alive in one process share parallel_state; the reference's
    outputs stay put while the actor trains, and it refuses to train."""
    actor = _engine(ctx["model_dir"], layout, "causal_lm", {"lr": LR})
    reference = _engine(ctx["model_dir"], layout, "causal_lm", {"inference_only": True})
    local = _rows(ctx["batch"], actor.dp_rank, actor.dp_size)
    before = reference.forward(local, temperature=TEMPERATURE).batch["log_probs"]
    actor_before = actor.forward(local, temperature=TEMPERATURE).batch["log_probs"]
    _step(actor, local)
    after = reference.forward(local, temperature=TEMPERATURE).batch["log_probs"]
    actor_after = actor.forward(local, temperature=TEMPERATURE).batch["log_probs"]
    try:
        reference.forward_backward(local, policy_loss)
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    return {"same_start": torch.equal(before, actor_before), "reference_unchanged": torch.equal(before, after),
            "actor_moved": not torch.equal(actor_before, actor_after), "refused": refused}


EXTRA_SCENARIOS = {"tp2": [checkpoint_resume, non_finite_gradient],
                   "tp2pp2": [other_layout_checkpoint_refused, checkpoint_resume, export, offload_round_trip,
                              actor_and_reference, refusals]}


def _run_layout(ctx, layout_name, layout, scenarios, results):
    from verl_like.engine.megatron.parallel import reset_model_parallel

    for function in EXTRA_SCENARIOS.get(layout_name, []):
        try:
            results[f"{layout_name}/{function.__name__}"] = function(ctx, layout)
        except Exception:  # noqa: BLE001 - reported to the test that reads this scenario
            results[f"{layout_name}/{function.__name__}"] = {"error": traceback.format_exc()}
        dist.barrier()
    for name, (kind, fields) in scenarios.items():
        try:
            results[f"{layout_name}/{name}"] = train_step(ctx, layout, kind, fields)
        except Exception:  # noqa: BLE001 - reported to the test that reads this scenario
            results[f"{layout_name}/{name}"] = {"error": traceback.format_exc()}
        dist.barrier()
    reset_model_parallel()


def _worker(rank: int, port: int, ctx: dict, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ctx = dict(ctx, rank=rank)
    results: dict = {}
    only = ctx.get("only")  # to debug one layout by hand: run_megatron_scenarios(..., only=["tp2"])
    for layout_name, layout in LAYOUTS.items():
        if only is None or layout_name in only:
            _run_layout(ctx, layout_name, layout, SCENARIOS, results)
    vpp_name, vpp_layout = VPP_LAYOUT
    if only is None or vpp_name in only:
            _run_layout(dict(ctx, model_dir=ctx["deep_model_dir"]), vpp_name, vpp_layout,
                    VPP_SCENARIOS, results)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def run_megatron_scenarios(
    model_dir: str, tied_model_dir: str, deep_model_dir: str, vocab_size: int, workdir: str,
    only: list[str] | None = None,
) -> list[dict]:
    """Every layout and scenario on 4 gloo ranks (files under `workdir`); returns each rank's results."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = {"model_dir": model_dir, "tied_model_dir": tied_model_dir, "deep_model_dir": deep_model_dir,
           "vocab_size": vocab_size, "batch": make_batch(ROWS, vocab_size, seed=0), "workdir": workdir,
           "only": only}
    mp.spawn(_worker, args=(port, ctx, workdir), nprocs=WORLD_SIZE, join=True)
    return [torch.load(Path(workdir) / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD_SIZE)]
