"""Synthetic tasks for the embedded default job: deterministic train / sft / test splits from a seed.

Every task draws a question and its answer from a seeded `random.Random`; all characters lie in the tiny
tokenizer's alphabet (verl_like/models/tiny.py) and answers are a few characters long. The held-out `test` split
is disjoint from `train` and `sft` by construction: a question belongs to the test pool exactly when a stable hash
of its text falls in one bucket of `HELD_OUT_BUCKETS`, whatever the seed or split sizes.

Splits: `train` (the RL prompts), `test` (held-out validation, no duplicates), `sft` (the warm start's supervised
data, drawn from the same non-test pool with its own seed). Rows follow the dataset format of
verl_like/data/dataset.py: `prompt` (chat messages), `reward_model.ground_truth`, `data_source`, `extra_info`.

`resolve_data_files("synthetic:add:test", cache_dir)` writes the split to parquet once and returns its path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from verl_like.config.data import SYNTHETIC_PREFIX
from verl_like.data.preprocess import write_rows

logger = logging.getLogger(__name__)

SPLITS = ("train", "test", "sft")
HELD_OUT_BUCKETS = 8  # one question in 8 belongs to the held-out test pool
_SPLIT_SEED_OFFSET = {"train": 0, "test": 1, "sft": 2}
_FORMAT_VERSION = 2  # bump when the rows a task generates change, so cached parquet files are rebuilt


@dataclass(frozen=True)
class SyntheticTask:
    """A question generator `make(rng) -> (question, answer, flawed_answer)`, its `ability` label and a one-line
    description. `flawed_answer` is what a demonstrator with the task's typical bug writes (equal to `answer`
    where the bug does not show); the warm start imitates such a demonstrator (verl_like/models/warmstart.py)."""

    name: str
    make: Callable[[random.Random], tuple[str, str, str]]
    ability: str
    description: str
    flaw: str
    tokenizer: str = "chars"  # the tiny tokenizer its model needs (verl_like/models/tiny.py)
    answer_prefix: str | None = None  # scored on the text after the last prefix (multi-turn), else the whole text
    # Image tasks: question (a layout key) -> PNG bytes of its picture; the prompt is then `prompt_text` with the
    # picture in the row's `images` column (data/synthetic_vision.py).
    render: Callable[[str], bytes] | None = None
    prompt_text: str | None = None


def _digits(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(low, high)))


def _add(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    forgot_carry = (a // 10 + b // 10) * 10 + (a % 10 + b % 10) % 10
    return f"{a}+{b}=?", str(a + b), str(forgot_carry)


def _reverse(rng: random.Random) -> tuple[str, str, str]:
    digits = _digits(rng, 3, 6)
    return f"reverse {digits}", digits[::-1], digits


def _sort(rng: random.Random) -> tuple[str, str, str]:
    digits = _digits(rng, 3, 6)
    return f"sort {digits}", "".join(sorted(digits)), "".join(sorted(digits, reverse=True))


def _calc(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    # A guess of the right size with one digit wrong: what answering without the tool looks like.
    exact = str(a * b)
    place = rng.randrange(len(exact))
    wrong = str((int(exact[place]) + rng.randint(1, 9)) % 10)
    if place == 0 and wrong == "0":
        wrong = "1" if exact[0] != "1" else "2"
    return f"calc {a}*{b}", exact, exact[:place] + wrong + exact[place + 1:]


CALC_TOOL = "calculator"

from verl_like.data.synthetic_vision import PROMPT_TEXT as _COUNT_PROMPT  # noqa: E402
from verl_like.data.synthetic_vision import make_count as _count  # noqa: E402
from verl_like.data.synthetic_vision import render_count as _render_count  # noqa: E402

TASKS: dict[str, SyntheticTask] = {
    task.name: task
    for task in (
        SyntheticTask("add", _add, "arithmetic", "sum of two numbers in [0, 99], '37+48=?' -> '85'",
                      "forgets the carry from the ones column ('37+48=?' -> '75')"),
        SyntheticTask("reverse", _reverse, "string", "3 to 6 digits in reverse order, 'reverse 4821' -> '1284'",
                      "copies the digits unchanged ('reverse 4821' -> '4821')"),
        SyntheticTask("sort", _sort, "string", "3 to 6 digits in ascending order, 'sort 4021' -> '0124'",
                      "sorts in descending order ('sort 4021' -> '4210')"),
        SyntheticTask("calc", _calc, "tool", "a 3-digit times a 2-digit number, 'calc 347*29' -> 'answer: 10063', "
                      "which the tiny model can only get right by calling the calculator tool",
                      "answers without the tool, one digit wrong ('answer: 10963')", tokenizer="tools",
                      answer_prefix="answer:"),
        SyntheticTask("count", _count, "vision", "how many squares (1 to 4) a 48x48 picture shows, answered as one "
                      "digit; a tiny vision-language model", "counts one square too many", tokenizer="vlm",
                      render=_render_count, prompt_text=_COUNT_PROMPT),
    )
}
DEFAULT_TASK = "sort"


def get_task(name: str) -> SyntheticTask:
    """The task registered as `name`; raises naming the known tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; known tasks: {sorted(TASKS)} (use 'synthetic:<task>')")
    return TASKS[name]


def data_source_of(task: str) -> str:
    """The `data_source` column of a synthetic task's rows (the reward registry maps it to its scorer)."""
    return f"synthetic/{task}"


def is_held_out(question: str) -> bool:
    """True when `question` belongs to the held-out test pool (a stable hash, independent of seeds)."""
    digest = hashlib.sha256(question.encode()).digest()
    return digest[0] % HELD_OUT_BUCKETS == 0


def _row(task: SyntheticTask, split: str, index: int, question: str, answer: str, flawed: str) -> dict:
    if task.render is not None:
        return {
            "data_source": data_source_of(task.name),
            "prompt": [{"role": "user", "content": task.prompt_text}],
            "images": [{"bytes": task.render(question)}],
            "ability": task.ability,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "question": question, "answer": answer,
                           "flawed_answer": flawed},
        }
    return {
        "data_source": data_source_of(task.name),
        "prompt": [{"role": "user", "content": question}],
        "ability": task.ability,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer,
                       "flawed_answer": flawed},
    }


def generate_split(task: str, split: str, size: int, seed: int = 0) -> list[dict]:
    """`size` rows of `split` for `task`, the same for the same arguments on every machine.

    The test split holds distinct questions from the held-out pool; train and sft draw from the rest (with
    repeats, as a sampler over an infinite task would).
    """
    spec = get_task(task)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    if size < 1:
        raise ValueError(f"size={size} must be >= 1")
    rng = random.Random(f"{task}:{split}:{seed + _SPLIT_SEED_OFFSET[split]}")
    held_out = split == "test"
    rows: list[dict] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < size:
        attempts += 1
        if attempts > 200 * size + 10_000:
            raise ValueError(
                f"task {task!r} cannot supply {size} distinct held-out questions (got {len(rows)}); ask for fewer"
            )
        question, answer, flawed = spec.make(rng)
        if is_held_out(question) != held_out:
            continue
        if held_out:
            if question in seen:
                continue
            seen.add(question)
        rows.append(_row(spec, split, len(rows), question, answer, flawed))
    return rows


@dataclass(frozen=True)
class SyntheticSizes:
    """Rows per split of the embedded default task."""

    train: int = 8192
    test: int = 256
    sft: int = 4096

    def of(self, split: str) -> int:
        return getattr(self, split)


def write_split(task: str, split: str, cache_dir: str | os.PathLike, size: int, seed: int = 0) -> Path:
    """Writes `split` of `task` to `<cache_dir>/synthetic/<task>_<split>_<size>_s<seed>_v<N>.parquet` once.

    Written to a temporary file and renamed, so concurrent callers never read a partial file.
    """
    path = Path(cache_dir) / "synthetic" / f"{task}_{split}_{size}_s{seed}_v{_FORMAT_VERSION}.parquet"
    if path.is_file():
        return path
    write_rows(generate_split(task, split, size, seed), path)
    return path


def parse_synthetic_spec(spec: str) -> tuple[str, str]:
    """`synthetic:<task>[:<split>]` -> (task, split); split defaults to train."""
    if not spec.startswith(SYNTHETIC_PREFIX):
        raise ValueError(f"{spec!r} is not a synthetic data spec; write 'synthetic:<task>[:<split>]'")
    parts = spec[len(SYNTHETIC_PREFIX):].split(":")
    if len(parts) > 2 or not parts[0]:
        raise ValueError(
            f"bad synthetic data spec {spec!r}; write 'synthetic:<task>' or 'synthetic:<task>:<split>' with task in "
            f"{sorted(TASKS)} and split in {SPLITS}"
        )
    task, split = parts[0], parts[1] if len(parts) == 2 else "train"
    get_task(task)
    if split not in SPLITS:
        raise ValueError(f"bad synthetic data spec {spec!r}: split {split!r} is not one of {SPLITS}")
    return task, split


def resolve_data_files(
    spec: str | Sequence[str],
    cache_dir: str | os.PathLike,
    sizes: SyntheticSizes = SyntheticSizes(),
    seed: int = 0,
) -> list[str]:
    """Data file paths for a config value: `synthetic:<task>[:<split>]` entries become generated parquet files in
    `cache_dir`; other entries are paths (a comma-separated string or a list) that must exist."""
    entries = [spec] if isinstance(spec, str) else list(spec)
    files: list[str] = []
    for entry in entries:
        for item in (part.strip() for part in str(entry).split(",")):
            if not item:
                continue
            if item.startswith(SYNTHETIC_PREFIX):
                task, split = parse_synthetic_spec(item)
                files.append(str(write_split(task, split, cache_dir, sizes.of(split), seed)))
                continue
            path = Path(item).expanduser()
            if not path.is_file():
                raise FileNotFoundError(
                    f"data file {item!r} does not exist; pass a parquet/jsonl file, or 'synthetic:<task>' with task in "
                    f"{sorted(TASKS)} for a generated task"
                )
            files.append(str(path))
    if not files:
        raise ValueError(f"no data files in {spec!r}; pass at least one path or 'synthetic:<task>'")
    return files
