"""main_ppo with `+trainer=vlm_tiny` on image files, run as a user runs it (real Hydra, Ray, FSDP2, vLLM with images).

Shortened to 2 steps on 48 pictures with the untrained tiny VLM (the preset's own warm start and 30 steps are
measured in docs/vision.md): the whole image path runs, the frozen tower trains on FSDP2, the reference sees the
actor's inputs (KL 0 before the first update), the frozen tower reaches vLLM with the first sync only, and the trainer's log-probs equal vLLM's on the image prompts every
step. The same job with its rollout in a vLLM server (the session's `vlm_server`) matches the trainer too. A bad
image row fails before Ray starts, naming the row.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_main_ppo import _main_ppo, _run

from verl_like.data.preprocess import write_rows
from verl_like.data.synthetic import generate_split
from verl_like.utils.tracking import read_metrics

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_vlm_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vlm_run")
    return {
        "model": str(tiny_vlm_dir),  # the session's (the vlm_server serves it too)
        "train": str(write_rows(generate_split("count", "train", 48), root / "train.parquet")),
        "val": str(write_rows(generate_split("count", "test", 16), root / "val.parquet")),
        "root": str(root),
    }


def short_job(files: dict[str, str], run: Path) -> list[str]:
    return ["+trainer=vlm_tiny", f"actor_rollout_ref.model.path={files['model']}",
            f"data.train_files={files['train']}", f"data.val_files={files['val']}", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.freeze_vision_tower=true", "actor_rollout_ref.actor.use_kl_loss=true",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2", "trainer.val_before_train=false", "reward_model.scoring_workers=1",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={run}"]


def test_vlm_preset_runs_on_image_files_with_the_trainers_log_probs_equal_to_vllms(files, verl_like_cache,
                                                                                   tmp_path):
    _run(short_job(files, tmp_path / "run"), Path(verl_like_cache))
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0 and "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/image_logprob_diff_max"] < 1e-4 for r in steps), steps  # every row has an image
    # The frozen tower went to vLLM with the first sync only (step 2's gap above was measured after a sync without it).
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(files["model"])
    tower = sum(p.numel() for p in model.model.vision_model.parameters())
    assert all(r["sync/bytes"] == 4 * (sum(p.numel() for p in model.parameters()) - tower) for r in steps)
    # Step 1 updates once, from the reference's weights: the reference saw the same ids and pixels as the actor.
    assert abs(steps[0]["actor/kl_loss"]) < 1e-6, steps[0]["actor/kl_loss"]
    assert any("val/score/mean" in r for r in records)
    # The checkpoint carries the processor, so the merged HF directory is a loadable VLM with its processor.
    from transformers import AutoProcessor

    from verl_like.model_merger import main as model_merger

    step = next((tmp_path / "run" / "checkpoints").glob("global_step_2"))
    model_merger(["merge", "--backend", "fsdp", "--local_dir", str(step / "actor"), "--target_dir",
                  str(tmp_path / "hf")])
    assert type(AutoModelForImageTextToText.from_pretrained(tmp_path / "hf")).__name__ == (
        "Idefics3ForConditionalGeneration")
    assert AutoProcessor.from_pretrained(tmp_path / "hf").image_processor.do_image_splitting is False


def test_vlm_preset_in_server_mode_has_the_trainers_log_probs_equal_to_the_servers(files, verl_like_cache,
                                                                                     vlm_server, tmp_path):
    job = [o for o in short_job(files, tmp_path / "run")
           if not o.startswith(("trainer.save_freq", "trainer.test_freq"))]
    _run([*job, "actor_rollout_ref.rollout.mode=server", f"actor_rollout_ref.rollout.server.address=[{vlm_server}]",
          "trainer.save_freq=-1", "trainer.test_freq=-1"], Path(verl_like_cache))
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0 and "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/image_logprob_diff_max"] < 1e-4 for r in steps), steps
    # The frozen tower reached the server with the link's first sync only (fp32 on the wire, as the server runs).
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(files["model"])
    tower = sum(p.numel() for p in model.model.vision_model.parameters())
    assert all(r["sync/bytes"] == 4 * (sum(p.numel() for p in model.parameters()) - tower) for r in steps), steps


def test_a_missing_image_is_refused_before_ray_naming_the_row(files, verl_like_cache, tmp_path):
    rows = generate_split("count", "train", 3)
    bad = tmp_path / "bad.jsonl"  # images as paths beside the file; row 2's is missing
    with open(bad, "w") as handle:
        for i, row in enumerate(rows):
            (tmp_path / f"{i}.png").write_bytes(row["images"][0]["bytes"])
            handle.write(json.dumps({**row, "images": [f"{i}.png" if i < 2 else "gone.png"]}) + "\n")
    start = time.monotonic()
    proc = _main_ppo([*short_job(files, tmp_path / "run"), f"data.train_files={bad}"], Path(verl_like_cache))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "bad.jsonl row 2: field 'images[0]': image file" in out and "does not exist" in out, out[-3000:]
    assert "starting a local Ray cluster" not in out
    assert time.monotonic() - start < 120
