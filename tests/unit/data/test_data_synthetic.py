"""Synthetic tasks: deterministic splits, a held-out split disjoint from training, parquet files on request."""

import os

import pyarrow.parquet as pq
import pytest

from verl_like.data.synthetic import (
    TASKS,
    SyntheticSizes,
    data_source_of,
    generate_split,
    is_held_out,
    parse_synthetic_spec,
    resolve_data_files,
)
from verl_like.models.tiny import check_encodable
from verl_like.rewards.synthetic import compute_score


@pytest.mark.parametrize("task", sorted(TASKS))
def test_answers_are_correct_and_encodable(task):
    for row in generate_split(task, "train", 200, seed=1):
        question, answer = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        flawed = row["extra_info"]["flawed_answer"]
        if task == "count":  # an image task: the layout key is in extra_info, the picture in `images`
            check_encodable(question.replace("<image>", "") + answer + flawed)
            squares = row["extra_info"]["question"].split(" ", 1)[1].split(",")
            assert int(answer) == len(squares) and int(flawed) == len(squares) + 1 and len(row["images"]) == 1
            continue
        check_encodable(question + answer + flawed)
        if task == "calc":  # a 3-digit times a 2-digit number; the flaw has one digit wrong
            a, b = (int(x) for x in question.split()[1].split("*"))
            assert int(answer) == a * b and len(flawed) == len(answer) and flawed != answer
            continue
        if task == "add":
            a, b = (int(x) for x in question.removesuffix("=?").split("+"))
            assert int(answer) == a + b
            ones = (a % 10 + b % 10) % 10
            assert int(flawed) == (a // 10 + b // 10) * 10 + ones  # the carry from the ones column is lost
            assert (flawed == answer) == (a % 10 + b % 10 < 10)
        elif task == "reverse":
            digits = question.split()[1]
            assert answer == digits[::-1] and flawed == digits and 3 <= len(digits) <= 6
        else:
            digits = question.split()[1]
            assert answer == "".join(sorted(digits)) and 3 <= len(digits) <= 6
            assert flawed == answer[::-1]  # sorted the wrong way
        assert row["data_source"] == data_source_of(task)
        assert compute_score(answer, row["reward_model"]["ground_truth"]) == 1.0


@pytest.mark.parametrize("task", sorted(TASKS))
def test_test_split_is_held_out_and_distinct(task):
    test = [r["extra_info"]["question"] for r in generate_split(task, "test", 200)]  # an image task's layout
    assert len(set(test)) == 200 and all(is_held_out(q) for q in test)
    for split in ("train", "sft"):
        questions = {r["extra_info"]["question"] for r in generate_split(task, split, 1000)}
        assert not questions & set(test)


def test_splits_are_deterministic_and_seeded():
    assert generate_split("add", "train", 50, seed=3) == generate_split("add", "train", 50, seed=3)
    assert generate_split("add", "train", 50, seed=3) != generate_split("add", "train", 50, seed=4)
    assert generate_split("add", "train", 50) != generate_split("add", "sft", 50)


def test_asking_for_more_held_out_questions_than_exist():
    with pytest.raises(ValueError, match=r"cannot supply 5000 distinct held-out questions"):
        generate_split("add", "test", 5000)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown synthetic task 'mul'; known tasks: \['add', 'calc', 'count', 'reverse', 'sort'\]"):
        generate_split("mul", "train", 5)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        generate_split("add", "dev", 5)
    with pytest.raises(ValueError, match="size=0 must be >= 1"):
        generate_split("add", "train", 0)


def test_parse_synthetic_spec():
    assert parse_synthetic_spec("synthetic:add") == ("add", "train")
    assert parse_synthetic_spec("synthetic:sort:test") == ("sort", "test")
    with pytest.raises(ValueError, match="split 'dev' is not one of"):
        parse_synthetic_spec("synthetic:add:dev")
    with pytest.raises(ValueError, match="bad synthetic data spec 'synthetic:'"):
        parse_synthetic_spec("synthetic:")
    with pytest.raises(ValueError, match="unknown synthetic task"):
        parse_synthetic_spec("synthetic:nope")
    with pytest.raises(ValueError, match="not a synthetic data spec"):
        parse_synthetic_spec("data.parquet")


def test_resolve_data_files_writes_parquet_once(tmp_path):
    sizes = SyntheticSizes(train=64, test=16, sft=8)
    [train] = resolve_data_files("synthetic:add", tmp_path, sizes)
    [test] = resolve_data_files(["synthetic:add:test"], tmp_path, sizes)
    assert pq.read_table(train).num_rows == 64 and pq.read_table(test).num_rows == 16
    assert pq.read_table(train).to_pylist() == generate_split("add", "train", 64)
    written = os.stat(train).st_mtime_ns
    assert resolve_data_files("synthetic:add", tmp_path, sizes) == [train]
    assert os.stat(train).st_mtime_ns == written  # not rewritten


def test_resolve_data_files_mixes_paths_and_checks_them(tmp_path):
    real = tmp_path / "mine.parquet"
    real.write_bytes(b"x")
    files = resolve_data_files(f"{real}, synthetic:sort:test", tmp_path, SyntheticSizes(test=8))
    assert files[0] == str(real) and files[1].endswith("sort_test_8_s0_v2.parquet")
    with pytest.raises(FileNotFoundError, match=r"data file '.*missing.parquet' does not exist"):
        resolve_data_files(str(tmp_path / "missing.parquet"), tmp_path)
    with pytest.raises(ValueError, match="no data files"):
        resolve_data_files(" , ", tmp_path)
