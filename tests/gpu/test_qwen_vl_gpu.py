"""Qwen2.5-VL image prompts through the in-process vLLM engine (bf16) and the trainer's forward, on one GPU.

The twin of the CPU tests of the Qwen2-VL families (tests/integration/engine/test_engine_qwen_vl.py,
tests/unit/data/test_data_vision_qwen.py), which cannot run vLLM or the real processor there: transformers'
Qwen2-VL processor and vLLM's model file import torchvision, which the GPU image has. A small random Qwen2.5-VL
(models/tiny_qwen_vl.py, head_dim 64 for FlashAttention), the synthetic counting pictures through the real
processor (placeholders expanded, patches, grids, M-RoPE positions made once per prompt), vLLM's sampled log-probs
against the trainer's on the same tokens (bf16 rollout vs fp32 trainer; the gap is printed for docs/vision.md).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("torchvision")

from verl_like.config.data import DataConfig  # noqa: E402
from verl_like.data.dataset import RLDataset  # noqa: E402
from verl_like.data.mrope import MROPE_POSITIONS  # noqa: E402
from verl_like.data.preprocess import write_rows  # noqa: E402
from verl_like.data.synthetic import generate_split  # noqa: E402
from verl_like.data.vision import load_processor  # noqa: E402
from verl_like.engine.config import EngineConfig  # noqa: E402
from verl_like.engine.micro_batches import engine_inputs  # noqa: E402
from verl_like.engine.model_loading import load_model  # noqa: E402
from verl_like.engine.model_outputs import micro_batch_outputs  # noqa: E402
from verl_like.models.tiny_qwen_vl import TinyQwenVLSpec, build_tiny_qwen_vl  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine  # noqa: E402

SPEC = TinyQwenVLSpec(model_type="qwen2_5_vl", hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=512, mrope_section=(8, 12, 12), vision_hidden_size=128, vision_heads=2,
                      vision_intermediate_size=256, torch_dtype="bfloat16")
SAMPLED = SamplingConfig(n=4, temperature=1.0, max_tokens=16, seed=3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen_vl(tmp_path_factory.mktemp("qwen_vl_gpu") / "qwen25vl", SPEC))


def _dataset(model_dir: str, rows: list, path) -> RLDataset:
    processor = load_processor(model_dir)
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    file = write_rows(rows, path)
    return RLDataset([str(file)], processor.tokenizer, DataConfig(train_files=str(file), max_prompt_length=64),
                     processor, model_dir)


@pytest.fixture(scope="module")
def dataset(model_dir, tmp_path_factory):
    return _dataset(model_dir, generate_split("count", "test", 4), tmp_path_factory.mktemp("rows") / "count.parquet")


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = VLLMRolloutEngine(model_dir, VLLMEngineOptions(dtype="bfloat16", max_model_len=128, max_num_seqs=32,
                                                            gpu_memory_utilization=0.3))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def trainer_model(model_dir):
    return load_model(EngineConfig(model_path=model_dir, dtype="float32")).cuda().eval()


def _gap(trainer_model, out) -> torch.Tensor:
    with torch.no_grad():
        tensors = engine_inputs(out, "causal_lm", "test").batch.to("cuda")
        ours = micro_batch_outputs(trainer_model, "causal_lm", tensors, False, SAMPLED.temperature)["log_probs"]
    mask = out.batch["response_mask"].bool()
    assert mask.sum() > 0
    return (ours.cpu() - out.batch["rollout_log_probs"]).abs()[mask]


def test_vllm_log_probs_on_image_prompts_match_the_trainers_in_bf16(engine, dataset, trainer_model):
    processed = dataset.vision.images_processed
    prompts = dataset.collate([dataset[i] for i in range(4)])
    assert dataset.vision.images_processed - processed == 4  # one per prompt, not per sample
    assert prompts.batch["image_grid_thw"].shape == (4, 1, 3) and MROPE_POSITIONS in prompts.batch.keys()
    sent = engine.images_sent
    out = engine.generate(prompts, SAMPLED)  # raises naming the row if vLLM's expansion differs from the dataset's
    assert engine.images_sent - sent == 4
    assert out.batch[MROPE_POSITIONS].shape == (16, 3, out.batch["input_ids"].shape[1])
    image_id = int(trainer_model.config.image_token_id)
    assert not (out.batch["responses"][out.batch["response_mask"].bool()] == image_id).any()
    gap = _gap(trainer_model, out)
    print(f"\nQwen2.5-VL bf16 vLLM vs fp32 trainer on image prompts: mean |dlogp| {float(gap.mean()):.3e}, "
          f"max {float(gap.max()):.3e} over {gap.numel()} tokens")
    assert float(gap.mean()) <= 2e-2  # bf16 rounding; wrong positions or pixels give O(0.1-1)


def test_a_prompt_with_two_images_of_different_sizes_matches_the_trainer(engine, model_dir, trainer_model,
                                                                         tmp_path):
    from PIL import Image

    rows = copy.deepcopy(generate_split("count", "test", 2))
    buffer = io.BytesIO()
    Image.new("RGB", (96, 48), (200, 200, 200)).save(buffer, format="PNG")
    rows[0]["images"] = rows[0]["images"] + [{"bytes": buffer.getvalue(), "path": None}]
    rows[0]["prompt"][0]["content"] = "<image>and<image>how many squares?"
    two = _dataset(model_dir, rows[:1], tmp_path / "two.parquet")
    prompts = two.collate([two[0]])
    assert int((prompts.batch["image_grid_thw"][0].prod(-1) > 0).sum()) == 2
    sent = engine.images_sent
    out = engine.generate(prompts, SAMPLED)
    assert engine.images_sent - sent == 2
    gap = _gap(trainer_model, out)
    print(f"\ntwo images: mean |dlogp| {float(gap.mean()):.3e}, max {float(gap.max()):.3e}")
    assert float(gap.mean()) <= 2e-2
