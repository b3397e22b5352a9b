"""Token budgets sized from free memory (engine/token_budget.py): the estimate, clamps, rounding, the reduction."""

from __future__ import annotations

import dataclasses
import socket

import pytest
import torch.multiprocessing as mp

from verl_like.engine.head_log_probs import CHUNK_BYTES
from verl_like.engine.token_budget import (
    ACTIVATION_SHARE,
    BUDGET_MULTIPLE,
    MAX_BUDGET,
    MIN_BUDGET,
    ActivationModel,
    ResidentState,
    agree,
    budgets_for,
    bytes_per_token,
    min_over_ranks,
    pending_bytes,
    size_budget,
)
from verl_like.shapes.decoder import DecoderShape

GIB = 1 << 30
QWEN_05B = DecoderShape(num_attention_heads=14, num_key_value_heads=2, head_dim=64, hidden_size=896,
                        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, num_hidden_layers=24)
QWEN_15B = DecoderShape(num_attention_heads=12, num_key_value_heads=2, head_dim=128, hidden_size=1536,
                        intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True, num_hidden_layers=28)
GPU = ActivationModel(compute_bytes=2, gradient_checkpointing=True, fused_layers=True, fused_log_probs=True)
STATE = ResidentState(trainable_local=494_000_000, master_bytes=4, optimizer_allocated=False,
                      optimizer_on_device=True, optimizer_offload=False, reshard_after_forward=True, reduce_bytes=4)


def _budget(free_gib: float, shape: DecoderShape = QWEN_05B, model: ActivationModel = GPU, training: bool = True,
            longest: int = 640) -> int:
    pending = pending_bytes(shape, STATE, model.compute_bytes, training)
    return size_budget(int(free_gib * GIB), pending, bytes_per_token(shape, model, training), longest)


def test_the_budget_grows_with_free_memory_and_stays_a_multiple_of_1024_in_the_clamps():
    budgets = [_budget(free) for free in (10, 20, 40, 60, 80, 100, 140)]
    assert budgets == sorted(budgets) and len(set(budgets)) > 3
    assert all(b % BUDGET_MULTIPLE == 0 and MIN_BUDGET <= b <= MAX_BUDGET for b in budgets)


def test_the_budget_shrinks_with_the_model():
    assert _budget(60, QWEN_15B) < _budget(60, QWEN_05B)
    assert bytes_per_token(QWEN_15B, GPU, True) > bytes_per_token(QWEN_05B, GPU, True)
    wider = dataclasses.replace(QWEN_05B, vocab_size=2 * QWEN_05B.vocab_size)
    deeper = dataclasses.replace(QWEN_05B, num_hidden_layers=48)
    for bigger in (wider, deeper):
        assert bytes_per_token(bigger, GPU, True) > bytes_per_token(QWEN_05B, GPU, True)
    # the unsharded root (embeddings) grows with the vocabulary; the shards come from the engine (STATE)
    assert pending_bytes(wider, STATE, 2, True) > pending_bytes(QWEN_05B, STATE, 2, True)


def test_what_each_switch_costs_per_token():
    base = bytes_per_token(QWEN_05B, GPU, True)
    assert bytes_per_token(QWEN_05B, dataclasses.replace(GPU, gradient_checkpointing=False), True) > 2 * base
    assert bytes_per_token(QWEN_05B, dataclasses.replace(GPU, fused_log_probs=False), True) > 2 * base
    assert bytes_per_token(QWEN_05B, dataclasses.replace(GPU, fused_layers=False), True) > base
    assert bytes_per_token(QWEN_05B, dataclasses.replace(GPU, compute_bytes=4), True) == 2 * base
    assert bytes_per_token(QWEN_05B, GPU, training=False) < base / 2  # a forward keeps no activations


def test_the_estimate_is_at_least_what_the_h200_update_measured():
    # docs/benchmarks.md, sixth session: the 0.5B update's peak grew 15.8 GiB from 32,768 to 65,536-token
    # micro-batches (fused log-probs, checkpointing, bf16): about 505 KiB a token. The estimate must not be lower.
    measured = 15.8 * GIB / 32768
    assert bytes_per_token(QWEN_05B, dataclasses.replace(GPU, fused_layers=False), True) >= measured


def test_clamps_and_the_longest_sequence():
    assert _budget(0.5) == MIN_BUDGET  # less free than the model needs: the floor
    assert _budget(10_000) == MAX_BUDGET
    assert _budget(0.5, longest=40_000) == 40_000  # one sample must fit, whatever the estimate
    assert size_budget(GIB, 0, 100_000, 1, safety=1.0) == 10240  # 10,737 tokens, rounded down to 1,024s
    assert size_budget(GIB + 10 * 100_000, 10 * 100_000, 100_000, 1, safety=1.0) == 10240  # pending comes off


def test_pending_bytes_count_what_is_not_allocated_yet():
    update = pending_bytes(QWEN_05B, STATE, 2, True)
    after_a_step = pending_bytes(QWEN_05B, dataclasses.replace(STATE, optimizer_allocated=True), 2, True)
    assert update - after_a_step == 2 * STATE.trainable_local * 4  # AdamW's two moments
    offloaded = pending_bytes(QWEN_05B, dataclasses.replace(STATE, optimizer_on_device=False), 2, True)
    assert offloaded < after_a_step  # offload_policy: gradients and moments stay in CPU memory
    lora = pending_bytes(QWEN_05B, dataclasses.replace(STATE, trainable_local=0), 2, True)
    assert lora == offloaded
    forward = pending_bytes(QWEN_05B, STATE, 2, False)
    assert forward < update
    assert pending_bytes(QWEN_05B, dataclasses.replace(STATE, optimizer_offload=True), 2, False) < forward
    assert pending_bytes(QWEN_05B, dataclasses.replace(STATE, reshard_after_forward=False), 2, True) > update


def test_the_chunked_head_takes_the_logits_out_of_the_per_token_cost():
    chunked = dataclasses.replace(GPU, chunked_head=True)
    per_token = bytes_per_token(QWEN_05B, chunked, True)
    # what is left: 24 layer inputs (checkpointing) and one layer's activations and their gradients, bf16
    layer = (6 * 896 + 2 * 896 + 2 * 128 + 3 * 4864) * 2
    assert per_token == 24 * 896 * 2 + 2 * layer
    assert bytes_per_token(QWEN_05B, GPU, True) - per_token == 2 * 151936 * 2
    assert bytes_per_token(QWEN_05B, chunked, False) == layer
    # its workspace is a fixed cost: two chunks of logits, the head's float32 gradient and one chunk's share
    workspace = (pending_bytes(QWEN_05B, STATE, 2, True, chunked_head=True) - pending_bytes(QWEN_05B, STATE, 2, True))
    assert workspace == 2 * CHUNK_BYTES + 151936 * 896 * (4 + 2)
    assert pending_bytes(QWEN_05B, STATE, 2, False, chunked_head=True) - pending_bytes(QWEN_05B, STATE, 2, False) \
        == CHUNK_BYTES


def test_the_activation_share_caps_the_budget_when_much_more_is_free():
    chunked = dataclasses.replace(GPU, chunked_head=True)
    h100 = 80 * GIB
    free = budgets_for(["update"], QWEN_15B, chunked, STATE, 70 * GIB, 640)["update"]
    capped = budgets_for(["update"], QWEN_15B, chunked, STATE, 70 * GIB, 640, device_bytes=h100)["update"]
    per_token = bytes_per_token(QWEN_15B, chunked, True)
    assert capped < free
    assert capped * per_token <= ACTIVATION_SHARE * h100 < (capped + BUDGET_MULTIPLE) * per_token
    # when little is free, free memory decides, the cap changes nothing
    assert budgets_for(["update"], QWEN_15B, chunked, STATE, 12 * GIB, 640, device_bytes=h100) == \
        budgets_for(["update"], QWEN_15B, chunked, STATE, 12 * GIB, 640)
    assert size_budget(10 * GIB, 0, 100_000, 1, safety=1.0, device_bytes=20 * GIB) == 20480  # 2 GiB / 100 kB


def test_log_prob_passes_get_a_larger_budget_than_the_update():
    budgets = budgets_for(["update", "log_prob", "ref_log_prob"], QWEN_05B, GPU, STATE, 40 * GIB, 640)
    assert budgets["update"] < budgets["log_prob"] == budgets["ref_log_prob"]


def test_every_rank_takes_the_smallest_budget_of_each_pass():
    assert agree([[65536, 131072], [32768, 131072], [49152, 98304]]) == [32768, 98304]
    assert agree([[4096]]) == [4096]
    with pytest.raises(ValueError):
        agree([])
    with pytest.raises(ValueError):
        agree([[1, 2], [1]])


def test_one_process_needs_no_collective():
    assert min_over_ranks([8192, 16384], None, 1.0, "actor_rollout") == [8192, 16384]


def _rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results[rank] = min_over_ranks([65536 if rank else 32768, 8192 * (rank + 1)], None, 30.0, "actor_rollout")
    dist.destroy_process_group()


def test_two_gloo_ranks_agree_on_the_smallest():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, results), nprocs=2, join=True)
        assert results[0] == results[1] == [32768, 8192]


def test_an_engine_takes_a_sized_budget_only_for_token_micro_batches():
    from types import SimpleNamespace

    from verl_like.engine.base import TrainEngine
    from verl_like.engine.config import EngineConfig

    engine = SimpleNamespace(config=EngineConfig(model_path="tiny", use_dynamic_bsz=True, max_tokens_per_rank=16384))
    TrainEngine.set_token_budget(engine, 65536)
    assert engine.config.max_tokens_per_rank == 65536 and engine.config.micro_batching.max_tokens == 65536
    engine.config = EngineConfig(model_path="tiny")
    with pytest.raises(ValueError, match="use_dynamic_bsz"):
        TrainEngine.set_token_budget(engine, 65536)
