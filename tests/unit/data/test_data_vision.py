"""Image prompts in the dataset: rows checked before anything starts, placeholders expanded, pixels made once."""

import io
import re
import json

import pytest
import torch
from PIL import Image

from verl_like.config.data import DataConfig
from verl_like.data.dataset import RLDataset
from verl_like.data.rows import DataRowError
from verl_like.data.vision import MULTI_MODAL_DATA, RAW_PROMPT_IDS, check_image_rows, load_processor
from verl_like.models.tiny_vlm import TinyVLMSpec, build_tiny_vlm

SPEC = TinyVLMSpec()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny_vlm", SPEC)


@pytest.fixture(scope="module")
def processor(vlm_dir):
    return load_processor(str(vlm_dir))


def png(colour=(255, 255, 255), size=(48, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def row(prompt, images, truth="1"):
    return {"prompt": prompt, "images": images, "data_source": "synthetic/count",
            "reward_model": {"ground_truth": truth}}


def config(path, **kwargs):
    return DataConfig(train_files=path, max_prompt_length=64, **kwargs)


def test_paths_and_content_parts_expand_to_the_processors_image_tokens(tmp_path, processor):
    Image.new("RGB", (30, 20), (9, 9, 9)).save(tmp_path / "a.png")
    parts = [{"type": "image"}, {"type": "text", "text": "how many?"}]
    # a path relative to the data file, and chat content parts
    path = write_jsonl(tmp_path / "d.jsonl", [row([{"role": "user", "content": parts}], ["a.png"])])
    dataset = RLDataset([path], processor.tokenizer, config(path), processor)
    item = dataset[0]
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert item.input_ids.count(image_id) == SPEC.image_tokens
    assert list(item.raw_prompt_ids).count(image_id) == 1
    # the expansion equals the processor's own, text and image together
    text = processor.tokenizer.apply_chat_template([{"role": "user", "content": "<image>how many?"}],
                                                   add_generation_prompt=True, tokenize=False)
    expected = processor(text=text, images=[Image.open(tmp_path / "a.png").convert("RGB")], add_special_tokens=False)
    assert item.input_ids == expected["input_ids"][0]


def test_collate_processes_each_image_once_and_pads_unused_slots(tmp_path, processor):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def images(*colours):
        return [{"bytes": png(c), "path": None} for c in colours]

    rows = [row("<image>count", images((40, 0, 0))), row("<image>and<image>", images((80, 0, 0), (0, 80, 0))),
            row("<image>again", images((120, 0, 0)))]
    path = tmp_path / "d.parquet"  # verl's layout: images as [{"bytes", "path"}] in parquet
    pq.write_table(pa.Table.from_pylist(rows), path)
    dataset = RLDataset([str(path)], processor.tokenizer, config(str(path)), processor)
    batch = dataset.collate([dataset[i] for i in range(3)])
    assert dataset.vision.images_processed == 4
    pixels, mask = batch.batch["pixel_values"], batch.batch["pixel_attention_mask"]
    assert pixels.shape == (3, 2, 3, SPEC.image_size, SPEC.image_size)  # the dataset's most images per row
    assert not pixels[0, 1].any() and not mask[0, 1].any() and mask[1].all()  # an unused slot is all zeros
    assert [len(d["image"]) for d in batch.non_tensor_batch[MULTI_MODAL_DATA]] == [1, 2, 1]
    assert batch.non_tensor_batch[RAW_PROMPT_IDS][1] == list(dataset[1].raw_prompt_ids)


@pytest.mark.parametrize("prompt, images, message", [
    ("<image><image>two?", ["a.png"], "row 0: the prompt has 2 image placeholder"),
    ("none?", ["a.png"], "row 0: the prompt has 0 image placeholder"),
    ("<image>gone?", ["missing.png"], "row 0: field 'images[0]': image file"),
    ("<image>broken?", ["broken.png"], "row 0: field 'images[0]': not a readable image"),
], ids=["two_placeholders_one_image", "no_placeholder", "missing_file", "undecodable"])
def test_bad_image_rows_are_refused_naming_the_row(tmp_path, processor, prompt, images, message):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    path = write_jsonl(tmp_path / "d.jsonl", [row(prompt, images)])
    with pytest.raises(DataRowError, match=re.escape(message)):
        check_image_rows([path], config(path))  # the preflight, before Ray
    with pytest.raises(DataRowError, match=re.escape(message)):
        RLDataset([path], processor.tokenizer, config(path), processor)


def test_videos_a_text_model_and_text_rows_among_image_rows_are_refused(tmp_path, processor):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    path = write_jsonl(tmp_path / "v.jsonl", [{**row("<image>x", ["a.png"]), "videos": ["clip.mp4"]}])
    with pytest.raises(DataRowError, match="video prompts are not supported"):
        RLDataset([path], processor.tokenizer, config(path), processor)
    path = write_jsonl(tmp_path / "t.jsonl", [row("<image>x", ["a.png"])])
    with pytest.raises(DataRowError, match="has no image processor"):
        RLDataset([path], processor.tokenizer, config(path), None)
    path = write_jsonl(tmp_path / "m.jsonl", [row("<image>x", ["a.png"]), row("text only", None)])
    with pytest.raises(DataRowError, match=re.escape("m.jsonl row 1: field 'images' is empty")):
        check_image_rows([path], config(path))
    with pytest.raises(DataRowError, match="mixing text and image rows"):
        RLDataset([path], processor.tokenizer, config(path), processor)


def test_an_image_prompt_is_never_truncated(tmp_path, processor):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    path = write_jsonl(tmp_path / "d.jsonl", [row("<image>" + "x" * 40, ["a.png"])])
    short = DataConfig(train_files=path, max_prompt_length=30, truncation="left")
    with pytest.raises(DataRowError, match="would cut image tokens"):
        RLDataset([path], processor.tokenizer, short, processor)


def test_geometry3k_files_convert_to_image_rows_the_dataset_reads(tmp_path, processor):
    import importlib.util
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_like.rewards.registry import default_compute_score

    script = Path(__file__).parents[3] / "examples" / "data_preprocess" / "geometry3k.py"
    spec = importlib.util.spec_from_file_location("preprocess_geometry3k", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = tmp_path / "train-00000-of-00001.parquet"  # hiyouga/geometry3k's columns
    pq.write_table(pa.Table.from_pylist([
        {"images": [{"bytes": png(), "path": None}], "problem": "<image>Find x.", "answer": "3"},
        {"images": [{"bytes": png((0, 9, 9)), "path": None}], "problem": "Find the area.", "answer": "12"},
    ]), source)
    out = module.main(["--input", str(source), "--split", "train", "--output", str(tmp_path / "geo.parquet")])
    dataset = RLDataset([str(out)], processor.tokenizer, DataConfig(train_files=str(out), max_prompt_length=256),
                        processor)
    assert [len(item.images) for item in dataset.items] == [1, 1]
    assert dataset[1].raw_prompt[0]["content"].startswith("<image>Find the area.")  # placeholder put in front
    assert default_compute_score("hiyouga/geometry3k", "so x is \\boxed{3}", "3") == 1.0
