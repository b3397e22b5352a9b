"""A user's script without an `if __name__ == "__main__":` guard, as verl's tutorial writes one, trains end to end:
nothing verl_like starts (the reward manager's scoring processes included) imports the user's main module again
(issue #31, item 9). Each import of the script appends a line to a file; exactly one may appear."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from verl_like.models.tiny import build_tiny_model  # noqa: E402
from verl_like.utils.tracking import read_metrics  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SCRIPT = '''
import os, sys
with open(os.environ["IMPORTS_LOG"], "a") as log:
    log.write(f"{__name__} {os.getpid()}\\n")

from verl_like.trainer import PPOTrainer

trainer = PPOTrainer(sys.argv[1:])
trainer.fit()
print("guard-less script finished")
'''


def test_guardless_script_with_scoring_workers_runs_once_and_finishes(tmp_path):
    script, log, run = tmp_path / "train.py", tmp_path / "imports.log", tmp_path / "run"
    script.write_text(SCRIPT)
    model = build_tiny_model(tmp_path / "model")  # untrained: the run is what is tested, not its reward
    env = {**os.environ, "PYTHONPATH": str(REPO), "IMPORTS_LOG": str(log)}
    env.pop("RAY_ADDRESS", None)
    args = ["+trainer=ci_smoke", f"actor_rollout_ref.model.path={model}", "trainer.total_training_steps=1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "reward_model.scoring_workers=2", f"trainer.default_local_dir={run}"]
    result = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=480)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "guard-less script finished" in result.stdout
    assert log.read_text().splitlines() == [f"__main__ {log.read_text().split()[1]}"]  # imported once, as main
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]
