"""Qwen2-VL image prompts in the dataset and the rollout batches: placeholders framed and expanded, patches and grids
per row made once, M-RoPE positions made with the batch and continued over responses and agent-loop trajectories;
on a machine without torchvision the processor and the vLLM engine are refused naming it.

transformers' Qwen2-VL processor class needs its torchvision video processor, so here a stand-in processor pairs
the tokenizer with transformers' torchvision-free PIL image processor (the same resize and patching numerics);
the real processor runs in tests/gpu/test_qwen_vl_gpu.py.
"""

import importlib.util
import json

import pytest
import torch
from PIL import Image

from verl_like.config.data import DataConfig
from verl_like.data.dataset import RLDataset
from verl_like.data.mrope import MROPE_POSITIONS
from verl_like.data.vision import RAW_PROMPT_IDS, load_processor
from verl_like.models.tiny_qwen_vl import IMAGE_PAD, VISION_END, VISION_START, TinyQwenVLSpec, build_tiny_qwen_vl
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.batch import build_rollout_batch
from verl_like.rollout.trajectory import LossMaskReason, Trajectory, build_trajectory_batch

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


class PilQwenProcessor:
    """The parts of Qwen2VLProcessor the dataset calls: `image_token`, `tokenizer`, `image_processor`, and
    `__call__` expanding each `<|image_pad|>` to its image's t*h*w / 4 tokens."""

    image_token = IMAGE_PAD

    def __init__(self, tokenizer, side: int) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.tokenizer = tokenizer
        self.image_processor = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side)

    def __call__(self, text, images, add_special_tokens=False, return_tensors="pt"):
        out = self.image_processor(images, return_tensors="pt")
        counts = iter((out["image_grid_thw"].prod(-1) // 4).tolist())
        text = "".join(piece + (IMAGE_PAD * next(counts) if i < text.count(IMAGE_PAD) else "")
                       for i, piece in enumerate(text.split(IMAGE_PAD)))
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens, return_tensors="pt")["input_ids"]
        return {"input_ids": ids, **out}


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return build_tiny_qwen_vl(tmp_path_factory.mktemp("qwen_vl") / "tiny", TinyQwenVLSpec())


@pytest.fixture(scope="module")
def dataset(qwen_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("qwen_rows")
    Image.new("RGB", (112, 112), (200, 10, 10)).save(folder / "square.png")
    Image.new("RGB", (224, 112), (10, 200, 10)).save(folder / "wide.png")
    rows = [
        {"prompt": "<image>how many?", "images": ["square.png"]},
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                                 {"type": "image"}]}], "images": ["wide.png", "square.png"]},
    ]
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps({**row, "data_source": "synthetic/count", "reward_model": {"ground_truth": "1"}}) + "\n" for row in rows))
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    processor = PilQwenProcessor(tokenizer, TinyQwenVLSpec().image_side)
    return RLDataset([str(path)], tokenizer, DataConfig(train_files=str(path), max_prompt_length=96), processor,
                     str(qwen_dir))


def test_placeholders_are_framed_expanded_once_per_image_and_kept_single_for_vllm(dataset):
    tokenizer = dataset.tokenizer
    pad, start, end = (tokenizer.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VISION_START, VISION_END))
    square, two = dataset[0], dataset[1]
    wide_grid = dataset.vision.processor.image_processor([two.images[0]])["image_grid_thw"][0].tolist()
    assert wide_grid[1] < wide_grid[2]  # resized within 112^2 pixels, keeping the aspect
    wide_patches = wide_grid[0] * wide_grid[1] * wide_grid[2]
    assert square.input_ids.count(pad) == 16 and two.input_ids.count(pad) == wide_patches // 4 + 16
    assert square.input_ids.count(start) == square.input_ids.count(end) == 1
    assert list(two.raw_prompt_ids).count(pad) == 2 and two.raw_prompt_ids.count(start) == 2
    assert (square.image_slots, two.image_slots) == (64, wide_patches + 64)  # patches: 8 x 8 for the square


def test_collate_makes_patches_grids_and_mrope_positions_once_per_prompt(dataset):
    processed = dataset.vision.images_processed
    batch = dataset.collate([dataset[0], dataset[1]])
    assert dataset.vision.images_processed == processed + 3
    slots = dataset[1].image_slots
    assert batch.batch["pixel_values"].shape == (2, slots, 3 * 2 * 14 * 14)
    grids = batch.batch["image_grid_thw"]
    assert grids[0].tolist() == [[1, 8, 8], [0, 0, 0]] and grids[1, 1].tolist() == [1, 8, 8]
    assert int(grids[1].prod(-1).sum()) == slots
    assert not batch.batch["pixel_values"][0, 64:].any()  # row 0's one image fills 64 of the patch slots
    assert batch.batch["pixel_values"][1, slots - 1].any()
    positions = batch.batch[MROPE_POSITIONS]
    assert positions.shape == (2, 3, 96)
    # Text positions are equal on all three axes; an image's tokens spread over its grid.
    mask = batch.batch["attention_mask"].bool()
    last = positions[:, :, -1]
    assert torch.equal(last[:, 0], last[:, 1]) and torch.equal(last[:, 1], last[:, 2])
    assert int(last[0, 0]) < int(mask[0].sum()) - 1  # the image's 16 tokens took 4 x 4 positions
    assert batch.non_tensor_batch[RAW_PROMPT_IDS][1] == list(dataset[1].raw_prompt_ids)


def test_rollout_batches_continue_the_prompt_positions_over_the_response(dataset):
    prompts = dataset.collate([dataset[0], dataset[1]])
    sampling = SamplingConfig(n=2, max_tokens=4)
    out = build_rollout_batch(prompts, [[7, 8], [9], [7, 7, 7, 7], [8, 9, 2]], [[0.0] * 2, [0.0], [0.0] * 4,
                                                                                  [0.0] * 3], sampling, 0, {})
    positions = out.batch[MROPE_POSITIONS]
    assert positions.shape == (4, 3, 100)
    top = prompts.batch[MROPE_POSITIONS].amax(dim=(1, 2))
    assert positions[:, :, 96:].tolist() == [[[int(top[r // 2]) + 1 + k for k in range(4)]] * 3 for r in range(4)]
    assert torch.equal(out.batch["pixel_values"][3], prompts.batch["pixel_values"][1])

    trajectories = []
    for row in range(4):
        trajectory = Trajectory(prompt_ids=list(dataset[row // 2].input_ids))
        trajectory.add_sampled([7, 8], [0.0, 0.0])
        trajectory.add_inserted([9], LossMaskReason.TOOL)
        trajectories.append(trajectory)
    loop = build_trajectory_batch(prompts, trajectories, 2, 96, 4, 0, {})
    assert torch.equal(loop.batch[MROPE_POSITIONS][:, :, :99], positions[:, :, :99])
    trajectories[3].prompt_ids = trajectories[3].prompt_ids[1:]
    with pytest.raises(ValueError, match="sample 3: the agent loop's prompt is not the dataset's prompt"):
        build_trajectory_batch(prompts, trajectories, 2, 96, 4, 0, {})


@pytest.mark.skipif(HAS_TORCHVISION, reason="torchvision loads here: the processor and vLLM's model file load")
def test_without_torchvision_the_processor_and_the_engine_are_refused_naming_it(qwen_dir):
    from verl_like.rollout.vllm_vision import vision_llm_kwargs

    with pytest.raises(RuntimeError, match="needs torchvision, which does not load on this machine"):
        load_processor(str(qwen_dir))
    with pytest.raises(RuntimeError, match="vLLM's qwen2_5_vl model file imports torchvision"):
        vision_llm_kwargs(str(qwen_dir))


def test_only_the_qwen_families_get_engine_arguments(tmp_path):
    from verl_like.rollout.vllm_vision import vision_llm_kwargs

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3"}))
    assert vision_llm_kwargs(str(tmp_path)) == {}
    assert vision_llm_kwargs(str(tmp_path / "absent")) == {}
