"""trainer.logger=[console,tensorboard,wandb] works together with no W&B credentials or network: an offline run in
the run directory (issue #31, item 4)."""

from __future__ import annotations

import os

import pytest

from verl_like.utils.tracking import Tracking, wandb_mode

pytest.importorskip("wandb")


def test_wandb_mode_is_offline_without_credentials_and_online_with_them(tmp_path):
    netrc = tmp_path / "netrc"
    assert wandb_mode({}, netrc) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}, netrc) == "online"
    assert wandb_mode({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}, netrc) == "disabled"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    os.chmod(netrc, 0o600)
    assert wandb_mode({}, netrc) == "online"


def test_console_tensorboard_and_wandb_log_together_offline(tmp_path, monkeypatch):
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc with a W&B login
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracking = Tracking(["console", "tensorboard", "wandb"], tmp_path / "run", project="p", experiment="e",
                        config={"data": {"train_batch_size": 4}})
    for step in (1, 2):
        tracking.log({"critic/score/mean": 0.5 * step, "timing_s/step": 1.0}, step)
    tracking.close()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), list((tmp_path / "run").rglob("*"))
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
