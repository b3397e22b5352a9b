"""`python -m verl_like.main_ppo <verl's command> trainer.dry_run=true`: validates with the paths checked and prints
the plan, starting no Ray and writing nothing (issue #31). verl's PPO (critic), GRPO, DAPO and Megatron example
command lines, with local data and model paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "config"))
import verl_example_commands as verl  # noqa: E402

from verl_like.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
# Long enough for the scripts' prompt + response lengths; 4 layers and 2 KV heads split into Megatron's TP 2 x PP 2.
SPEC = TinyModelSpec(num_hidden_layers=4, max_position_embeddings=4096)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("dry_run")
    model = build_tiny_model(root / "model", SPEC)
    data = root / "data"
    data.mkdir()
    rows = {"data_source": ["openai/gsm8k"] * 4, "prompt": [[{"role": "user", "content": "1+1?"}]] * 4,
            "reward_model": [{"ground_truth": "2", "style": "rule"}] * 4}
    for split in ("train", "test"):
        pq.write_table(pa.table(rows), data / f"{split}.parquet")
    return {"data": str(data), "model": str(model), "reward_model": str(model), "run_dir": str(root / "run")}


@pytest.mark.parametrize("name", ["PPO_GAE_CRITIC", "GRPO", "DAPO", "PPO_MEGATRON"])
def test_verl_example_dry_run_prints_the_plan_and_writes_nothing(name, paths, tmp_path, monkeypatch):
    from verl_like.main_ppo import dry_run

    monkeypatch.chdir(tmp_path)
    out = dry_run([*(a.format(**paths) for a in verl.ALL[name]), "trainer.device=cuda"])
    assert out.startswith("dry run: the config is valid")
    for section in ("roles:", "cluster:", "batch sizes:", "algorithm:", "verl keys:", "ignored, and why:"):
        assert f"\n{section}\n" in out
    assert list(tmp_path.iterdir()) == [] and not Path(paths["run_dir"]).exists()  # nothing written
    if name == "PPO_GAE_CRITIC":
        assert "critic (fsdp2)" in out and "critic.model.fsdp_config.param_offload=False: verl's name" in out
        assert "trainer.use_legacy_worker_impl=auto: verl chooses" in out
    if name == "PPO_MEGATRON":
        assert "actor (megatron)" in out and "data-parallel size 2" in out and "--config-name=ppo_megatron" in out
    if name == "DAPO":
        assert "dynamic sampling on score, at most 40 generation rounds" in out and "overlong penalty" in out


def test_main_ppo_dry_run_starts_no_ray_and_creates_no_directory(paths, tmp_path):
    code = ("import sys; from verl_like.main_ppo import main; main(sys.argv[1:]); "
            "print('ray imported' if 'ray' in sys.modules else 'ray not imported')")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERL_LIKE_FORCE_CPU": "1"}
    args = [a.format(**paths) for a in verl.PPO_GAE_CRITIC]
    result = subprocess.run([sys.executable, "-c", code, *args, "trainer.device=cuda", "trainer.dry_run=true"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dry run: the config is valid" in result.stdout and result.stdout.rstrip().endswith("ray not imported")
    assert list(tmp_path.iterdir()) == [] and not Path(paths["run_dir"]).exists()


def test_dry_run_reports_a_config_error_naming_the_key(paths, tmp_path, monkeypatch):
    from verl_like.config.errors import ConfigError
    from verl_like.main_ppo import dry_run

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="trainer.nnodes=1 x trainer.n_gpus_per_node=3 workers"):
        dry_run([*(a.format(**paths) for a in verl.RLOO), "trainer.device=cuda", "trainer.n_gpus_per_node=3",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    assert list(tmp_path.iterdir()) == []
