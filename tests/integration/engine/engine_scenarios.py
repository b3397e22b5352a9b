"""What each rank of the 2-process gloo group runs for the engine tests; results come back to pytest by file.

One spawn runs every scenario (a process spawn costs ~10 s of imports on 2 cores). A scenario that raises
records its error text instead of failing the others.
"""

from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine_reference import TEMPERATURE, make_batch, policy_loss, score_loss, value_loss

ROWS = 8
LR = 1e-3
# Adam's first step moves a weight by lr * g / (|g| + eps): with the default eps=1e-8, gradients near 1e-9 make
# that ill-conditioned and float32 vs float64 differ by ~lr. A larger eps keeps the comparison well-posed.
ADAM_EPS = 1e-5
LOSSES = {"causal_lm": policy_loss, "value": value_loss, "sequence_classifier": score_loss}

# name -> (model kind, EngineConfig overrides, rows of rank 0 (rank 1 gets the rest))
DATA_PARALLEL_SCENARIOS = {
    "padded_no_micro_batches": ("causal_lm", {"micro_batch_size_per_rank": 4, "grad_clip": None}, 4),
    "padded_micro_batches": ("causal_lm", {"micro_batch_size_per_rank": 1}, 4),
    "padded_dynamic": ("causal_lm", {"use_dynamic_bsz": True, "max_tokens_per_rank": 20}, 4),
    "packed_micro_batches": ("causal_lm", {"use_remove_padding": True, "micro_batch_size_per_rank": 2}, 4),
    "packed_dynamic_checkpointed": (
        "causal_lm",
        {"use_remove_padding": True, "use_dynamic_bsz": True, "max_tokens_per_rank": 24,
         "gradient_checkpointing": True},
        4,
    ),
    "uneven_rows": ("causal_lm", {"micro_batch_size_per_rank": 2}, 5),
    "value_padded": ("value", {"micro_batch_size_per_rank": 2}, 4),
    "value_packed": ("value", {"use_remove_padding": True, "micro_batch_size_per_rank": 3}, 4),
    "scores_padded": ("sequence_classifier", {"micro_batch_size_per_rank": 2}, 4),
    "scores_packed": ("sequence_classifier", {"use_remove_padding": True, "micro_batch_size_per_rank": 3}, 4),
    "bfloat16_params": ("causal_lm", {"dtype": "bfloat16", "micro_batch_size_per_rank": 2}, 4),
    "bfloat16_compute_float32_reduce": (
        "causal_lm", {"param_dtype": "bfloat16", "reduce_dtype": "float32", "micro_batch_size_per_rank": 2}, 4,
    ),
    "offload_policy_packed": (  # FSDP2 CPUOffloadPolicy: CPU-resident shards, CPU optimizer step
        "causal_lm", {"offload_policy": True, "use_remove_padding": True, "micro_batch_size_per_rank": 2}, 4,
    ),
    "eager_attention_packed": (
        "causal_lm", {"attn_implementation": "eager", "use_remove_padding": True, "micro_batch_size_per_rank": 4}, 4,
    ),
}


def _engine(model_dir: str, kind: str = "causal_lm", **overrides):
    from verl_like.engine.config import EngineConfig
    from verl_like.engine.fsdp import FSDPEngine

    return FSDPEngine(EngineConfig(model_path=model_dir, model_kind=kind, lr=LR, eps=ADAM_EPS, **overrides))


def _local(batch: dict, rank: int, rows_rank0: int):
    from verl_like.protocol import DataProto

    rows = slice(0, rows_rank0) if rank == 0 else slice(rows_rank0, None)
    return DataProto.from_dict(tensors={key: value[rows] for key, value in batch.items()})


def _full_weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in engine.full_state_iterator()}


def data_parallel(ctx, kind, overrides, rows_rank0):
    engine = _engine(ctx["model_dir"], kind, **overrides)
    local = _local(ctx["batch"], ctx["rank"], rows_rank0)
    forward = engine.forward(local, temperature=TEMPERATURE, calculate_entropy=True)
    result = engine.forward_backward(local, LOSSES[kind], temperature=TEMPERATURE)
    grad_norm = engine.optimizer_step()
    weights = _full_weights(engine)  # a collective: every rank iterates
    return {
        "outputs": dict(forward.batch.items()),
        "loss": result.loss,
        "metrics": result.metrics,
        "num_micro_batches": result.num_micro_batches,
        "grad_norm": grad_norm,
        "weights": weights if ctx["rank"] == 0 else None,
        "shards": {name: shard.clone() for name, shard in engine.local_weight_shards().items()},
    }


def chunked_head_packed(ctx):
    """packed_dynamic_checkpointed with the chunked LM head forced on (engine/head_log_probs.py, 3 tokens a chunk),
    on the untied and the tied model; counts the chunked head's calls."""
    from verl_like.engine import head_log_probs

    kind, overrides, rows_rank0 = DATA_PARALLEL_SCENARIOS["packed_dynamic_checkpointed"]
    calls = []
    original_rows, original_head = head_log_probs.chunk_rows, head_log_probs.head_token_log_probs
    os.environ["VERL_LIKE_CHUNKED_HEAD"] = "1"
    head_log_probs.chunk_rows = lambda vocab, itemsize: 3
    head_log_probs.head_token_log_probs = lambda *a, **k: calls.append(1) or original_head(*a, **k)
    try:
        untied = data_parallel(ctx, kind, overrides, rows_rank0)
        tied = data_parallel(dict(ctx, model_dir=ctx["tied_model_dir"]), kind, overrides, rows_rank0)
    finally:
        os.environ.pop("VERL_LIKE_CHUNKED_HEAD")
        head_log_probs.chunk_rows, head_log_probs.head_token_log_probs = original_rows, original_head
    return {"untied": untied, "tied": tied, "chunked_calls": len(calls)}


def lr_schedule(ctx):
    engine = _engine(ctx["model_dir"], lr_scheduler="cosine", warmup_steps=2, total_steps=5, min_lr_ratio=0.1)
    lrs = []
    for _ in range(6):
        lrs.append(engine.current_lr)
        engine.optimizer_step()  # no gradients: only the schedule moves
    return {"lrs": lrs, "global_step": engine.global_step}


def scaled_lr_step(ctx):
    """One step at lr_scale=0.5 (the asynchronous driver's staleness scaling), then the rejected scales."""
    engine = _engine(ctx["model_dir"])
    engine.forward_backward(_local(ctx["batch"], ctx["rank"], 4), policy_loss, temperature=TEMPERATURE)
    grad_norm = engine.optimizer_step(lr_scale=0.5)
    refusals = {}
    for scale in (0.0, 1.5):
        try:
            engine.optimizer_step(lr_scale=scale)
            refusals[scale] = "no error"
        except ValueError as exc:
            refusals[scale] = str(exc)
    weights = _full_weights(engine)  # a collective: every rank iterates
    return {"grad_norm": grad_norm, "lr_after": engine.current_lr, "refusals": refusals,
            "global_step": engine.global_step, "weights": weights if ctx["rank"] == 0 else None}


def non_finite_gradient(ctx):
    engine = _engine(ctx["model_dir"])
    before = _full_weights(engine)
    local = _local(ctx["batch"], ctx["rank"], 4)

    def nan_loss(outputs, micro_batch):
        loss, metrics = policy_loss(outputs, micro_batch)
        return loss * float("nan"), metrics

    engine.forward_backward(local, nan_loss)
    grad_norm = engine.optimizer_step()
    after = _full_weights(engine)
    unchanged = all(torch.equal(before[name], after[name]) for name in before)
    return {"grad_norm": grad_norm, "unchanged": unchanged, "global_step": engine.global_step}


def checkpoint_resume(ctx):
    """Three steps straight vs two steps, save, a fresh engine loads, third step: identical."""
    batches = [_local(make_batch(ROWS, ctx["vocab_size"], seed), ctx["rank"], 4) for seed in (11, 12, 13)]
    schedule = {"lr_scheduler": "cosine", "warmup_steps": 1, "total_steps": 4, "weight_decay": 0.1}

    def step(engine, local):
        engine.forward_backward(local, policy_loss)
        return engine.optimizer_step()

    straight = _engine(ctx["model_dir"], **schedule)
    norms_straight = [step(straight, local) for local in batches]
    weights_straight = _full_weights(straight)

    first = _engine(ctx["model_dir"], **schedule)
    for local in batches[:2]:
        step(first, local)
    directory = Path(ctx["workdir"]) / "checkpoint"
    first.save_checkpoint(directory)
    first.save_checkpoint(directory)  # replacing a finished checkpoint works too
    draws_after_save = torch.rand(4)

    resumed = _engine(ctx["model_dir"], seed=123, **schedule)
    torch.manual_seed(999)
    resumed.load_checkpoint(directory)
    draws_after_load = torch.rand(4)
    step_after_load = resumed.global_step
    lr_after_load = resumed.current_lr
    norm_resumed = step(resumed, batches[2])
    weights_resumed = _full_weights(resumed)
    try:
        resumed.load_checkpoint(Path(ctx["workdir"]) / "never_written")
        missing_error = None
    except FileNotFoundError as exc:
        missing_error = str(exc)
    return {
        "missing_error": missing_error,
        "norm_straight": norms_straight[2],
        "norm_resumed": norm_resumed,
        "weights_equal": all(torch.equal(weights_straight[k], weights_resumed[k]) for k in weights_straight),
        "rng_restored": torch.equal(draws_after_save, draws_after_load),
        "step_after_load": step_after_load,
        "lr_after_load": lr_after_load,
        "entries": sorted(p.name for p in directory.parent.iterdir()),
        "files": sorted(p.name for p in directory.iterdir()),
    }


def export(ctx):
    from transformers import AutoTokenizer

    results = {}
    for kind, model_dir in (("causal_lm", ctx["tied_model_dir"]), ("value", ctx["model_dir"])):
        engine = _engine(model_dir, kind)
        local = _local(ctx["batch"], ctx["rank"], 4)
        engine.forward_backward(local, LOSSES[kind])
        engine.optimizer_step()
        tokenizer = AutoTokenizer.from_pretrained(model_dir) if kind == "causal_lm" else None
        directory = Path(ctx["workdir"]) / f"export_{kind}"
        engine.export_hf(directory, tokenizer)
        checkpoint = Path(ctx["workdir"]) / f"checkpoint_{kind}"  # what verl_like.model_merger reads
        engine.save_checkpoint(checkpoint)
        outputs = engine.forward(local, temperature=TEMPERATURE)
        results[kind] = {"directory": str(directory), "checkpoint": str(checkpoint),
                         "outputs": dict(outputs.batch.items())}
    return results


def offload_round_trip(ctx):
    """offload() -> the engine refuses to compute -> onload() -> same outputs, and training goes on."""
    engine = _engine(ctx["model_dir"], param_offload=True, optimizer_offload=True)
    local = _local(ctx["batch"], ctx["rank"], 4)
    engine.forward_backward(local, policy_loss)
    engine.optimizer_step()
    before = engine.forward(local)
    engine.offload()
    try:
        engine.forward(local)
        refused = None
    except RuntimeError as exc:
        refused = str(exc)
    engine.onload()
    after = engine.forward(local)
    engine.forward_backward(local, policy_loss)
    grad_norm = engine.optimizer_step()
    return {
        "equal": torch.equal(before.batch["log_probs"], after.batch["log_probs"]),
        "refused": refused,
        "grad_norm_after_onload": grad_norm,
    }


def planning_errors(ctx):
    """Errors raised on one rank's data are raised on every rank (no hang)."""
    errors = {}
    rows_rank0 = 6  # rank 1 has 2 rows but rank 0 needs 6 micro-batches
    engine = _engine(ctx["model_dir"], micro_batch_size_per_rank=1)
    try:
        engine.forward(_local(ctx["batch"], ctx["rank"], rows_rank0))
    except Exception as exc:  # noqa: BLE001 - the test inspects the type and text
        errors["too_few_rows"] = f"{type(exc).__name__}: {exc}"
    batch = dict(ctx["batch"])
    budget = int(batch["attention_mask"].sum(dim=1).max())  # every row fits ...
    if ctx["rank"] == 1:  # ... except on rank 1, whose rows become fully valid (longer than the budget)
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
        batch["position_ids"] = torch.clamp(batch["attention_mask"].cumsum(1) - 1, min=0)
    budget_engine = _engine(ctx["model_dir"], use_dynamic_bsz=True, max_tokens_per_rank=budget)
    try:
        budget_engine.forward(_local(batch, ctx["rank"], 4))
    except Exception as exc:  # noqa: BLE001
        errors["over_budget"] = f"{type(exc).__name__}: {exc}"
    return errors


def token_budget_sizing(ctx):
    """engine/token_budget.py on real FSDP2 shards: each rank reads another free memory (patched: pending bytes +
    room for 8,192 / 16,384 tokens), both take the smaller budget (gloo MIN), and the engine micro-batches at it."""
    from verl_like.engine import token_budget
    from verl_like.shapes.decoder import DecoderShape

    engine = _engine(ctx["model_dir"], use_remove_padding=True, use_dynamic_bsz=True, max_tokens_per_rank=16384)
    shape = DecoderShape.from_hf_config(engine.model.config)
    model, state = token_budget.activation_model(engine), token_budget.resident_state(engine)
    per_token = token_budget.bytes_per_token(shape, model, training=True)
    pending = token_budget.pending_bytes(shape, state, model.compute_bytes, training=True)
    room = 8192 * (ctx["rank"] + 1)
    free = pending + int((room + 512) * per_token / token_budget.SAFETY_FRACTION)
    original, token_budget.free_device_bytes = token_budget.free_device_bytes, lambda: free
    original_total, token_budget.device_total_bytes = token_budget.device_total_bytes, lambda: 1 << 50  # no cap
    try:
        solo = token_budget.budgets_for(["update"], shape, model, state, free, 16)["update"]
        agreed = token_budget.size_engine_budgets(["update"], engine, None, 16, 30.0, "engine_scenarios")
    finally:
        token_budget.free_device_bytes, token_budget.device_total_bytes = original, original_total
    engine.set_token_budget(agreed["update"])
    result = engine.forward_backward(_local(ctx["batch"], ctx["rank"], 4), policy_loss)
    return {"solo": solo, "agreed": agreed, "max_tokens": engine.config.max_tokens_per_rank,
            "num_micro_batches": result.num_micro_batches, "trainable_local": state.trainable_local,
            "parameters": sum(p.numel() for p in engine.model.parameters())}


def _scenarios():
    scenarios = {name: (data_parallel, args) for name, args in DATA_PARALLEL_SCENARIOS.items()}
    for function in (chunked_head_packed, lr_schedule, scaled_lr_step, non_finite_gradient, checkpoint_resume, export,
                     offload_round_trip, planning_errors, token_budget_sizing):
        scenarios[function.__name__] = (function, ())
    return scenarios


def _worker(rank: int, world_size: int, port: int, ctx: dict, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    ctx = dict(ctx, rank=rank)
    results = {}
    for name, (function, args) in _scenarios().items():
        try:
            results[name] = function(ctx, *args)
        except Exception:  # noqa: BLE001 - reported to the test that reads this scenario
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def run_all_scenarios(
    model_dir: str, tied_model_dir: str, vocab_size: int, workdir: str, world_size: int = 2
) -> list[dict]:
    """Runs every scenario on `world_size` gloo ranks (files under `workdir`); returns each rank's results."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = {
        "model_dir": model_dir,
        "tied_model_dir": tied_model_dir,
        "vocab_size": vocab_size,
        "batch": make_batch(ROWS, vocab_size, seed=0),
        "workdir": workdir,
    }
    mp.spawn(_worker, args=(world_size, port, ctx, workdir), nprocs=world_size, join=True)
    return [torch.load(Path(workdir) / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]
