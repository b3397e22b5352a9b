"""scripts/verl_script_sweep.py: bash expands a verl script's command line through the python shim (nothing runs),
and each script is classified by the config validation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("verl_script_sweep", REPO / "scripts" / "verl_script_sweep.py")
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)

GRPO = """set -x
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B}
nvidia-smi
args=(actor_rollout_ref.rollout.n=4 "trainer.logger=['console','wandb']")
python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_files=$HOME/data/train.parquet \\
    data.val_files=$HOME/data/test.parquet actor_rollout_ref.model.path=$MODEL "${args[@]}" \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size=16 \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1 $@
"""


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "verl"
    (root / "examples" / "grpo").mkdir(parents=True)
    (root / "recipe").mkdir()
    (root / "examples" / "grpo" / "run.sh").write_text(GRPO)
    (root / "examples" / "grpo" / "sglang.sh").write_text(
        GRPO.replace("trainer.nnodes=1", "trainer.nnodes=1 actor_rollout_ref.rollout.name=sglang"))
    (root / "recipe" / "sft.sh").write_text("torchrun -m verl.trainer.fsdp_sft_trainer x=1  # not verl.trainer.main_ppo\n")
    (root / "recipe" / "other.sh").write_text("echo verl.trainer.main_ppo is mentioned only\n")
    return root


def test_bash_expands_the_command_line_and_nothing_runs(tmp_path):
    root = _tree(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    argvs = sweep.capture(root / "examples" / "grpo" / "run.sh", root, work)
    args = sweep.main_ppo_args(argvs)
    assert args[0] == "algorithm.adv_estimator=grpo"
    assert args[1].startswith("data.train_files=") and args[1].endswith("/home/data/train.parquet")
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B" in args
    assert "trainer.logger=['console','wandb']" in args  # an array element with quotes, as bash passes it
    assert args[-1] == "trainer.nnodes=1"


def test_each_script_is_classified_and_recorded(tmp_path, capsys):
    root = _tree(tmp_path)
    out = tmp_path / "sweep.jsonl"
    sweep.main([str(root), "--out", str(out), "--show", "all"])
    records = {r["script"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"examples/grpo/run.sh", "examples/grpo/sglang.sh", "recipe/other.sh", "recipe/sft.sh"}
    ok = records["examples/grpo/run.sh"]
    assert ok["class"] == "accepted", ok["reason"]
    # verl's deprecated global micro-batch size, divided by the 8 GPUs the command names
    assert any("read as actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2" in n for n in ok["notes"])
    refused = records["examples/grpo/sglang.sh"]
    assert refused["class"] == "refused" and "SGLang" in refused["reason"]
    assert records["recipe/other.sh"]["class"] == records["recipe/sft.sh"]["class"] == "not-main_ppo"
    assert "accepted: 1, not-main_ppo: 2, refused: 1 (of 4 scripts)" in capsys.readouterr().out
