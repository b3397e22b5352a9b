"""MegatronEngine on 4 gloo ranks (TP2 x DP2, PP2 x DP2, TP2 x PP2, PP2 x VPP2 x DP2) equals one float64 process
on the full batch: outputs, loss, grad norm and updated weights, for a policy and a value loss; plus its HF weight
views and which CPU shims a train step reaches."""

from __future__ import annotations

import pytest
import torch

from engine_reference import make_batch, reference_outputs, reference_step
from engine_scenarios import ADAM_EPS, LR, ROWS
from megatron_scenarios import LAYOUTS, SCENARIOS, VPP_LAYOUT, VPP_SCENARIOS, WORLD_SIZE
from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model
from verl_like.models.tiny import TinyModelSpec, build_tiny_model

CASES = [f"{layout}/{scenario}" for layout in LAYOUTS for scenario in SCENARIOS] + [
    f"{VPP_LAYOUT[0]}/{scenario}" for scenario in VPP_SCENARIOS]


@pytest.fixture(scope="module")
def deep_model_dir(tmp_path_factory) -> str:
    """4 layers, so that PP2 x VPP2 gives every model chunk one layer."""
    spec = TinyModelSpec(num_hidden_layers=4, seed=2)
    return str(build_tiny_model(tmp_path_factory.mktemp("engine_models") / "tiny_deep", spec))


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tied_model_dir, deep_model_dir, vocab_size, tmp_path_factory) -> dict:
    from megatron_scenarios import run_megatron_scenarios

    per_rank = run_megatron_scenarios(tiny_model_dir, tied_model_dir, deep_model_dir, vocab_size,
                                      str(tmp_path_factory.mktemp("megatron_scenarios")))

    def get(name: str) -> list[dict]:
        results = [rank_results[name] for rank_results in per_rank]
        for rank, result in enumerate(results):
            if "error" in result and len(result) == 1:
                pytest.fail(f"scenario {name!r} failed on rank {rank}:\n{result['error']}")
        return results

    return get


@pytest.fixture(scope="module")
def references(tiny_model_dir, deep_model_dir, vocab_size):
    """(model dir, kind, lr, eps, grad_clip) -> float64 outputs, loss, grad norm, initial and updated weights."""
    batch = make_batch(ROWS, vocab_size, seed=0)
    cache = {}

    def get(model_dir, kind, lr, eps, grad_clip):
        key = (model_dir, kind, lr, eps, grad_clip)
        if key not in cache:
            model = load_model(EngineConfig(model_path=model_dir, model_kind=kind)).double()
            initial = {name: p.detach().clone() for name, p in model.named_parameters()}
            with torch.no_grad():
                outputs = reference_outputs(model, kind, batch)
            loss, grad_norm, weights = reference_step(model, kind, batch, lr, eps, grad_clip)
            cache[key] = {"outputs": outputs, "loss": loss, "grad_norm": grad_norm, "weights": weights,
                          "initial": initial, "names": list(initial)}
        return cache[key]

    return get


def _reference(case, references, tiny_model_dir, deep_model_dir):
    layout, scenario = case.split("/")
    kind, fields = {**SCENARIOS, **VPP_SCENARIOS}[scenario]
    model_dir = deep_model_dir if layout == VPP_LAYOUT[0] else tiny_model_dir
    return kind, fields, references(model_dir, kind, fields.get("lr", LR), fields.get("eps", ADAM_EPS),
                                    fields.get("grad_clip", 1.0))


def _rows_of(dp_rank: int, dp_size: int) -> slice:
    return slice(dp_rank * ROWS // dp_size, (dp_rank + 1) * ROWS // dp_size)


@pytest.mark.parametrize("case", CASES)
def test_layout_matches_the_full_batch_reference(runs, references, tiny_model_dir, deep_model_dir, case):
    results = runs(case)
    kind, fields, reference = _reference(case, references, tiny_model_dir, deep_model_dir)
    dp_size = 1 + max(result["dp_rank"] for result in results)
    for result in results:  # every rank returns its DP rank's rows, not only the collecting ones
        rows = _rows_of(result["dp_rank"], dp_size)
        for key, expected in reference["outputs"].items():
            torch.testing.assert_close(result["outputs"][key], expected[rows].float(), atol=1e-5, rtol=1e-5,
                                       msg=f"{key} on DP rank {result['dp_rank']}")
        assert result["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7)
        assert result["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    weights = results[0]["weights"]
    assert list(weights) == reference["names"]  # the FSDP engine's names and order
    for name, expected in reference["weights"].items():
        if fields.get("eps", ADAM_EPS) == ADAM_EPS:  # a real Adam step: compare like the FSDP engine's tests
            torch.testing.assert_close(weights[name], expected.float(), atol=1e-5, rtol=0, msg=name)
        else:  # near-gradient step: the updates themselves must agree
            initial = reference["initial"][name]
            moved = (weights[name].double() - initial.float().double())
            expected_moved = expected - initial
            assert float(expected_moved.abs().max()) > 0, name
            torch.testing.assert_close(moved, expected_moved, atol=2e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_one_collecting_rank_per_dp_rank_and_the_same_micro_batches(runs, case):
    results = runs(case)
    collecting = sorted(result["dp_rank"] for result in results if result["collects_outputs"])
    assert collecting == sorted(set(result["dp_rank"] for result in results))
    assert len({result["num_micro_batches"] for result in results}) == 1
    by_dp = {}
    for result in results:  # metrics reach every TP/PP peer of a DP rank
        by_dp.setdefault(result["dp_rank"], []).append(result["metrics"])
    for metrics in by_dp.values():
        assert all(m == metrics[0] for m in metrics)


@pytest.mark.parametrize("case", [f"{layout}/policy_sgd_like" for layout in LAYOUTS] + [f"{VPP_LAYOUT[0]}/policy_sgd_like"])
def test_local_shards_are_the_holdings_boxes_of_the_full_tensors(runs, case):
    results = runs(case)
    weights = results[0]["weights"]
    holdings = results[0]["holdings"]
    assert all(result["holdings"] == holdings for result in results)  # pure: the same everywhere
    assert [name for name, _ in holdings.params] == list(weights)
    for index, (name, full_shape) in enumerate(holdings.params):
        covered = torch.zeros(full_shape, dtype=torch.bool)
        for rank in range(WORLD_SIZE):
            box = holdings.boxes[index][rank]
            shards = results[rank]["shards"]
            assert (box is None) == (name not in shards), (name, rank)
            if box is None:
                continue
            full = weights[name]
            expected = full[box.row_start:box.row_stop] if full.ndim == 1 else \
                full[box.row_start:box.row_stop, box.col_start:box.col_stop]
            assert torch.equal(shards[name], expected), (name, rank)
            if full.ndim == 1:
                covered[box.row_start:box.row_stop] = True
            else:
                covered[box.row_start:box.row_stop, box.col_start:box.col_stop] = True
        assert bool(covered.all()), f"{name}: no rank holds part of it"


# Which CPU shims one forward_backward + optimizer_step reaches with megatron-core 0.16.1; a new entry after an
# upgrade means megatron added a hard-coded CUDA spot (see engine/megatron/cpu_support.py).
EXPECTED_SHIMS = {
    "tp2": {"current_device", "cuda_device_arg", "rng_tracker"},
    "pp2": {"current_device", "cuda_device_arg", "rng_tracker", "synchronize"},
    "tp2pp2": {"current_device", "cuda_device_arg", "rng_tracker", "synchronize"},
    "pp2vpp2": {"current_device", "cuda_device_arg", "rng_tracker", "synchronize"},
}


def test_the_interleaved_schedule_gets_a_multiple_of_the_pipeline_size(runs):
    # each rank's 4 rows fit one token budget; megatron-core's interleaved schedule needs 2 micro-batches (PP=2)
    assert {result["num_micro_batches"] for result in runs(f"{VPP_LAYOUT[0]}/policy_one_budget")} == {2}


@pytest.mark.parametrize("layout", list(EXPECTED_SHIMS))
def test_a_train_step_reaches_exactly_the_known_cpu_shims(runs, layout):
    for result in runs(f"{layout}/policy_sgd_like"):
        assert set(result["shim_hits"]) == EXPECTED_SHIMS[layout]
        assert all(count > 0 for count in result["shim_hits"].values())


@pytest.mark.parametrize("layout", ["tp2", "tp2pp2"])
def test_checkpoint_resumes_exactly(runs, layout):
    for result in runs(f"{layout}/checkpoint_resume"):
        assert result["weights_equal"]
        assert result["norms"][0] == result["norms"][1]
        assert result["rng_restored"]
        assert result["step_after_load"] == 1
        assert result["lr_after_load"] == pytest.approx(LR)  # warmup 1, cosine from step 1: back at lr
        assert result["files"] == [f"rank{rank}.pt" for rank in range(WORLD_SIZE)]


def test_a_checkpoint_of_other_sizes_is_refused_naming_both(runs):
    for result in runs("tp2pp2/other_layout_checkpoint_refused"):
        text = result["error_text"]
        assert text is not None
        assert "'pipeline_model_parallel_size': 1" in text and "'pipeline_model_parallel_size': 2" in text


@pytest.mark.parametrize("kind", ["causal_lm", "value"])
def test_export_hf_loads_in_transformers_with_the_engine_outputs(runs, vocab_size, kind):
    results = runs("tp2pp2/export")
    batch = make_batch(ROWS, vocab_size, seed=0)
    directory = results[0][kind]["directory"]
    model = load_model(EngineConfig(model_path=directory, model_kind=kind)).double()
    with torch.no_grad():
        expected = reference_outputs(model, kind, batch)
    key = "log_probs" if kind == "causal_lm" else "values"
    for result in results:
        rows = _rows_of(result[kind]["dp_rank"], result[kind]["dp_size"])
        torch.testing.assert_close(result[kind]["outputs"][key], expected[key][rows].float(), atol=1e-5, rtol=1e-5)


def test_offload_refuses_to_compute_until_onload(runs):
    for result in runs("tp2pp2/offload_round_trip"):
        assert result["equal"]
        assert "call onload() first" in result["refused"]
        assert result["grad_norm_after_onload"] > 0


def test_refusals_name_the_key_and_the_fix(runs):
    for result in runs("tp2pp2/refusals"):
        assert "sequence_classifier" in result["reward_model"] and "fsdp2" in result["reward_model"]
        assert "dtype='float32'" in result["bfloat16"]
        assert "EngineConfig.gradient_checkpointing=True" in result["gradient_checkpointing"]
        assert "tensor_model_parallel_size" in result["other_sizes_in_one_process"]
        assert "megatron.sequence_parallel=true" in result["sequence_parallel"]


def test_a_non_finite_gradient_norm_skips_the_update(runs, references, tiny_model_dir):
    reference = references(tiny_model_dir, "causal_lm", LR, ADAM_EPS, 1.0)
    for result in runs("tp2/non_finite_gradient"):
        assert result["grad_norm"] != result["grad_norm"]  # NaN
        assert result["unchanged"]
        assert result["global_step"] == 2
        # The next step's norm is the clean full-batch norm: the NaN gradients were dropped.
        assert result["grad_norm_next"] == pytest.approx(reference["grad_norm"], rel=1e-5)
        assert result["bad_scale"] == "MegatronEngine.optimizer_step: lr_scale=0.0 must lie in (0, 1]"


def test_actor_and_inference_only_reference_share_one_process(runs):
    for result in runs("tp2pp2/actor_and_reference"):
        assert result["same_start"] and result["reference_unchanged"] and result["actor_moved"]
        assert "inference_only=True" in result["refused"]
