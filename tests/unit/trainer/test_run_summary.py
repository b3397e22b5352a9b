"""The end-of-run summary: held-out reward before -> after, steps and time, where everything is (issue #31)."""

from pathlib import Path

from verl_like.trainer.run_summary import RunRecord, format_summary


def test_summary_names_the_reward_change_the_files_and_the_commands(tmp_path):
    record = RunRecord(first_step=0, last_step=80, seconds=125.4)
    record.note_validation(0, {"val/score/mean": 0.12})
    record.note_validation(40, {"critic/score/mean": 0.5})  # no validation at this step
    record.note_validation(80, {"val/score/mean": 0.98})
    for step in (40, 80):
        (tmp_path / "checkpoints" / f"global_step_{step}" / "actor").mkdir(parents=True)
    text = format_summary(record, tmp_path, ("console", "jsonl", "tensorboard", "wandb"), save_freq=40)
    assert text.splitlines()[0] == "run finished: 80 step(s) (step 0 -> 80) in 2 min 5 s"
    assert "held-out reward (val/score/mean): 0.120 at step 0 -> 0.980 at step 80" in text
    assert f"metrics: {tmp_path / 'metrics.jsonl'}" in text and f"--logdir {tmp_path / 'tensorboard'}" in text
    assert "wandb sync" in text and f"python -m verl_like.report {tmp_path}" in text
    assert f"--local_dir {tmp_path / 'checkpoints' / 'global_step_80' / 'actor'}" in text


def test_summary_of_a_run_without_validation_or_checkpoints_says_so():
    text = format_summary(RunRecord(first_step=3, last_step=5, seconds=7), Path("/r"), ("console",), save_freq=-1)
    assert "2 step(s) (step 3 -> 5) in 7 s" in text
    assert "held-out reward: not measured" in text and "checkpoints: none saved (trainer.save_freq=-1)" in text
    assert "report:" not in text  # the report reads metrics.jsonl, which the console logger does not write


def test_summary_gives_the_largest_memory_any_step_logged():
    record = RunRecord(first_step=0, last_step=2, seconds=3)
    record.note_memory({"perf/max_memory_allocated_gb": 10.25, "perf/max_memory_reserved_gb": 12.0,
                        "perf/cpu_memory_used_gb": 3.0})
    record.note_memory({"perf/max_memory_allocated_gb": 9.0, "perf/max_memory_reserved_gb": 13.5,
                        "perf/cpu_memory_used_gb": 2.5, "actor/pg_loss": 100.0})
    text = format_summary(record, Path("/r"), ("console",), save_freq=-1)
    assert ("peak memory of an actor worker: device 10.2 GiB allocated, 13.5 GiB reserved (torch's allocator); "
            "host 3.0 GiB resident") in text


def test_summary_on_cpu_gives_host_memory_only_and_nothing_without_memory_metrics():
    record = RunRecord(first_step=0, last_step=1, seconds=1)
    assert "peak memory" not in format_summary(record, Path("/r"), ("console",), save_freq=-1)
    record.note_memory({"perf/cpu_memory_used_gb": 1.5})
    assert "peak memory of an actor worker: host 1.5 GiB resident" in format_summary(
        record, Path("/r"), ("console",), save_freq=-1)
