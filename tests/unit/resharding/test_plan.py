"""The sync plan, executed in one process over simulated FSDP shards, against slices of the full tensors."""

import pytest
import torch

from verl_like.shapes.decoder import DecoderShape
from verl_like.shapes.layout import Box, Placement, tp_slice
from verl_like.resharding.plan import build_sync_plan, fsdp_rows, param_specs

SHAPE = DecoderShape(num_attention_heads=4, num_key_value_heads=2, head_dim=4, hidden_size=16,
                   intermediate_size=24, vocab_size=70)
TIED = DecoderShape(4, 1, 4, 16, 24, 70, tie_word_embeddings=True)


def model_tensors(shape, seed=0):
    """Full HF tensors of a 2-layer Qwen2-style model, in named_parameters order."""
    generator = torch.Generator().manual_seed(seed)
    q, kv, h, i = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim, \
        shape.hidden_size, shape.intermediate_size
    names = [("model.embed_tokens.weight", (shape.vocab_size, h))]
    for layer in range(2):
        p = f"model.layers.{layer}."
        names += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.q_proj.bias", (q,)),
                  (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                  (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                  (p + "self_attn.o_proj.weight", (h, q)), (p + "mlp.gate_proj.weight", (i, h)),
                  (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i)),
                  (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    names += [("model.norm.weight", (h,)), ("lm_head.weight", (shape.vocab_size, h))]
    return {name: torch.randn(size, generator=generator) for name, size in names}


def region(tensor, box, row_offset=0, col_offset=0):
    rows = tensor[box.row_start - row_offset:box.row_stop - row_offset]
    if tensor.ndim == 2:
        stop = box.col_stop if box.col_stop is not None else col_offset + tensor.shape[1]
        rows = rows[:, box.col_start - col_offset:stop - col_offset]
    return rows


def simulate(plan, tensors):
    """Runs every bucket's pieces from the plan's holder boxes; returns {rank: {name: slice}}."""
    world = plan.world_size
    shards = {r: {} for r in range(world)}
    for index, spec in enumerate(plan.params):
        for r in range(world):
            box = plan.held(r, index)
            if box is not None:
                shards[r][spec.name] = region(tensors[spec.name], box).clone()
    assembling = {r: {} for r in range(world)}
    done = {r: {} for r in range(world)}
    for bucket in plan.buckets:
        for piece in bucket.pieces:
            spec = plan.params[piece.param]
            held = plan.held(piece.src, piece.param)
            assert held is not None, (piece, "sent by a rank that does not hold it")
            data = region(shards[piece.src][spec.name], piece.box, held.row_start, held.col_start)
            need = plan.needed(piece.dst, piece.param)
            target = assembling[piece.dst].setdefault(
                piece.param, torch.full(need.shape(spec.shape), float("nan")))
            region(target, piece.box, need.row_start, need.col_start).copy_(data)
        for rank in range(world):
            for index in bucket.complete:
                spec = plan.params[index]
                empty = torch.empty(plan.needed(rank, index).shape(spec.shape))
                done[rank][spec.name] = assembling[rank].pop(index, empty)
    return done


@pytest.mark.parametrize("world, tp", [(2, 1), (2, 2), (4, 2), (4, 4), (3, 1)])
@pytest.mark.parametrize("bucket_bytes", [1 << 20, 700])
def test_every_rank_gets_exactly_its_tp_slices(world, tp, bucket_bytes):
    if SHAPE.num_attention_heads % tp:
        pytest.skip("tp must divide the heads")
    tensors = model_tensors(SHAPE)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=4)
    plan = build_sync_plan(specs, world, tp, SHAPE, bucket_bytes)
    done = simulate(plan, tensors)
    for rank in range(world):
        assert list(done[rank]) == [s.name for s in specs]  # completed in training order
        for index, spec in enumerate(specs):
            box = tp_slice(spec.layout, spec.shape, SHAPE, rank % tp, tp)
            assert torch.equal(done[rank][spec.name], region(tensors[spec.name], box)), (rank, spec.name)


def test_small_buckets_bound_what_each_rank_assembles():
    tensors = model_tensors(SHAPE)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=4)
    largest = max(s.nbytes for s in specs)
    bucket = 1024
    assert bucket < largest
    plan = build_sync_plan(specs, 2, 1, SHAPE, bucket)
    assert len(plan.buckets) > len(build_sync_plan(specs, 2, 1, SHAPE, 1 << 30).buckets) == 1
    for b in plan.buckets:
        for rank in range(2):
            assembled = sum(p.box.numel(specs[p.param].shape) * 4 for p in b.pieces if p.dst == rank)
            assert assembled <= bucket
    # The embedding (70 x 16 floats = 4480 bytes) is cut into bands that travel in several buckets.
    assert sum(1 for b in plan.buckets if any(p.param == 0 for p in b.pieces)) >= 4


def test_tp_equal_to_world_moves_only_what_the_fsdp_shard_lacks():
    tensors = model_tensors(SHAPE)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=4)
    plan = build_sync_plan(specs, 2, 2, SHAPE, 1 << 20)
    remote = {(specs[p.param].layout.placement, specs[p.param].name)
              for b in plan.buckets for p in b.pieces if p.src != p.dst}
    placements = {placement for placement, _ in remote}
    # Column-parallel shards line up with FSDP's dim-0 chunks: q/k/v and gate/up never cross ranks.
    assert not placements & {Placement.Q_HEADS, Placement.KV_HEADS, Placement.COLUMN}
    assert {Placement.ROW, Placement.REPLICATED, Placement.VOCAB} <= placements
    # Each rank receives its row-parallel half from the other rank's rows: half of its slice.
    o_proj = next(i for i, s in enumerate(specs) if s.name.endswith("0.self_attn.o_proj.weight"))
    from_peer = sum(p.box.numel(specs[o_proj].shape) for b in plan.buckets for p in b.pieces
                    if p.param == o_proj and p.dst == 0 and p.src == 1)
    assert from_peer == 16 * 16 // 4


def test_tp1_receives_everything_but_its_own_shard_and_tied_head_is_skipped():
    tensors = model_tensors(TIED)
    del tensors["lm_head.weight"]  # FSDP's named_parameters lists a tied weight once
    named = [(n, tuple(t.shape)) for n, t in tensors.items()] + [("lm_head.weight", (70, 16))]
    specs = param_specs(named, TIED, element_size=2)
    assert "lm_head.weight" not in [s.name for s in specs]
    plan = build_sync_plan(specs, 2, 1, TIED, 1 << 20)
    total = sum(t.numel() for t in tensors.values()) * 2
    own = sum((fsdp_rows(t.shape[0], 2, 0)[1]) * (t.numel() // t.shape[0]) for t in tensors.values()) * 2
    assert plan.model_bytes == total == plan.loaded_bytes(0)
    assert plan.received_bytes(0) == total - own


def test_fsdp_rows_follow_torch_chunk():
    for rows in (1, 5, 8, 70):
        for world in (1, 2, 3, 4, 8):
            chunks = torch.arange(rows).chunk(world)
            for rank in range(world):
                start, stop = fsdp_rows(rows, world, rank)
                expected = chunks[rank].tolist() if rank < len(chunks) else []
                assert list(range(start, stop)) == expected


def test_plan_refuses_tp_not_dividing_world():
    specs = param_specs([("model.norm.weight", (16,))], SHAPE, 4)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 does not divide the world size 3"):
        build_sync_plan(specs, 3, 2, SHAPE, 1024)


def megatron_holders(specs, shape, tp, pp, dp, layers=2):
    """Holder boxes of a Megatron layout (rank = dp * pp * tp order: TP fastest, then DP, then PP, as Megatron's
    default order tp-cp-ep-dp-pp): each TP rank holds its slice of its stage's layers, DP replicas the same."""
    world = tp * pp * dp
    holders = []
    for spec in specs:
        per_rank = []
        for rank in range(world):
            tp_rank, pp_rank = rank % tp, rank // (tp * dp)
            name = spec.name
            if ".layers." in name:
                layer = int(name.split(".layers.")[1].split(".")[0])
                mine = layer // (layers // pp) == pp_rank
            else:
                mine = (pp_rank == 0) if "embed" in name else (pp_rank == pp - 1)
            if not mine:
                per_rank.append(None)
                continue
            rows = spec.shape[0]
            if spec.layout.placement in (Placement.Q_HEADS, Placement.KV_HEADS, Placement.COLUMN):
                per_rank.append(Box(tp_rank * rows // tp, (tp_rank + 1) * rows // tp))
            elif spec.layout.placement is Placement.ROW:
                cols = spec.shape[1]
                per_rank.append(Box(0, rows, tp_rank * cols // tp, (tp_rank + 1) * cols // tp))
            elif spec.layout.placement is Placement.VOCAB:  # padded like vLLM's vocab (multiple of 64), then split
                per = shape.padded_vocab_per_rank(tp)
                per_rank.append(Box(min(tp_rank * per, rows), min((tp_rank + 1) * per, rows)))
            else:
                per_rank.append(Box(0, rows))
        holders.append(tuple(per_rank))
    return tuple(holders)


@pytest.mark.parametrize("tp, pp, dp, rollout_tp", [(2, 1, 2, 2), (2, 1, 2, 1), (1, 2, 2, 2), (2, 2, 1, 4),
                                                    (2, 2, 1, 1), (2, 1, 1, 2)])
@pytest.mark.parametrize("bucket_bytes", [1 << 20, 700])
def test_megatron_shards_reach_every_rollout_rank_as_its_tp_slices(tp, pp, dp, rollout_tp, bucket_bytes):
    tensors = model_tensors(SHAPE)
    specs = param_specs([(n, tuple(t.shape)) for n, t in tensors.items()], SHAPE, element_size=4)
    world = tp * pp * dp
    if SHAPE.num_attention_heads % rollout_tp or world % rollout_tp:
        pytest.skip("vLLM TP must divide the heads and the world")
    plan = build_sync_plan(specs, world, rollout_tp, SHAPE, bucket_bytes, megatron_holders(specs, SHAPE, tp, pp, dp))
    done = simulate(plan, tensors)
    for rank in range(world):
        for spec in specs:
            box = tp_slice(spec.layout, spec.shape, SHAPE, rank % rollout_tp, rollout_tp)
            assert torch.equal(done[rank][spec.name], region(tensors[spec.name], box)), (rank, spec.name)
    sent = {}
    for bucket in plan.buckets:
        for piece in bucket.pieces:
            if piece.src != piece.dst:
                sent[piece.src] = sent.get(piece.src, 0) + 1
    if tp == rollout_tp and pp == 1:
        assert not sent  # Megatron's TP slices are vLLM's: nothing moves
    if dp > 1 and rollout_tp == 1:
        assert len(sent) == world  # every replica sends: the load is spread, not all on one rank


def test_plan_refuses_overlapping_and_missing_holdings():
    specs = param_specs([("model.norm.weight", (16,)), ("model.layers.0.mlp.up_proj.weight", (24, 16))], SHAPE, 4)
    overlapping = ((Box(0, 16), Box(0, 16)), (Box(0, 16), Box(8, 24)))
    with pytest.raises(ValueError, match="up_proj.weight overlap"):
        build_sync_plan(specs, 2, 1, SHAPE, 1024, overlapping)
    missing = ((Box(0, 16), None), (Box(0, 12), None))
    with pytest.raises(ValueError, match="no training rank holds part of model.layers.0.mlp.up_proj.weight"):
        build_sync_plan(specs, 2, 1, SHAPE, 1024, missing)
