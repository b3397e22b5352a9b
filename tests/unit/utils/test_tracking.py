import json
import logging

import pytest
import torch

from verl_like.utils.tracking import Tracking, read_metrics


def test_jsonl_and_tensorboard_receive_every_scalar_and_skip_non_scalars(tmp_path):
    tracker = Tracking(["console", "jsonl", "tensorboard"], tmp_path, experiment="t")
    tracker.log({"a": 1, "b": torch.tensor(2.5), "c": float("nan"), "skip": [1, 2], "flag": True}, step=1)
    tracker.log({"a": 3}, step=2)
    tracker.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == [{"step": 1, "a": 1.0, "b": 2.5, "c": None}, {"step": 2, "a": 3.0}]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_console_prints_headline_metrics(tmp_path, caplog):
    tracker = Tracking(["console"], tmp_path)
    with caplog.at_level(logging.INFO, logger="verl_like.utils.tracking"):
        tracker.log({"critic/score/mean": 0.5, "other": 1.0}, step=3)
    assert "step 3: critic/score/mean=0.5" in caplog.text


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "a": 1.0}) + "\n" + '{"step": 2, "a"')
    assert read_metrics(path) == [{"step": 1, "a": 1.0}]


def test_unknown_backend_names_the_key():
    with pytest.raises(ValueError, match=r"trainer.logger has unknown backends \['tensorbord'\]"):
        Tracking(["tensorbord"], "/tmp/unused")
