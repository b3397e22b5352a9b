"""Atomic directory writes: the final name only ever holds a finished directory."""

import pytest

from verl_like.utils.checkpoint import commit_directory, prepare_staging, staging_path


def test_commit_moves_the_staging_directory_into_place(tmp_path):
    final = tmp_path / "step_1"
    staging = prepare_staging(final)
    assert staging == staging_path(final) and staging.parent == tmp_path and staging.name.startswith(".")
    (staging / "weights.bin").write_text("new")
    commit_directory(staging, final)
    assert (final / "weights.bin").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


def test_commit_replaces_an_existing_directory(tmp_path):
    final = tmp_path / "latest"
    final.mkdir()
    (final / "old.bin").write_text("old")
    staging = prepare_staging(final)
    (staging / "new.bin").write_text("new")
    commit_directory(staging, final)
    assert sorted(p.name for p in final.iterdir()) == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_prepare_staging_clears_a_leftover_from_a_crash(tmp_path):
    final = tmp_path / "ckpt"
    leftover = staging_path(final)
    leftover.mkdir()
    (leftover / "half_written").write_text("x")
    assert list(prepare_staging(final).iterdir()) == []


def test_commit_without_staging_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        commit_directory(tmp_path / ".missing.tmp", tmp_path / "missing")
