"""examples/data_preprocess: GSM8K and MATH files as distributed -> rows RLDataset reads and the scorers grade."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_like.data.preprocess import read_source_records, source_files, write_rows
from verl_like.data.rows import DataRowError, load_rows
from verl_like.rewards.registry import default_compute_score

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "examples" / "data_preprocess"


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gsm8k = load_script("gsm8k")
math_dataset = load_script("math_dataset")

GSM8K = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A farm sells 1,200 eggs.", "answer": "It sells 1,200.\n#### 1,200"},
]
MATH = [
    {"problem": "What is $1/2 + 1/4$?", "solution": r"It is $\boxed{\frac{3}{4}}$.", "level": "Level 1",
     "type": "Algebra"},
    {"problem": "Simplify $\\sqrt{8}$.", "solution": r"We get $\boxed{2\sqrt{2}}$.", "level": "Level 2",
     "type": "Algebra"},
]


def test_gsm8k_final_answer_and_row():
    assert gsm8k.final_answer("work\n#### 1,200") == "1200"
    row = gsm8k.convert(GSM8K[0], "train", 0)
    assert row["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert row["prompt"][0]["content"].startswith("Tom has 3 apples") and "####" in row["prompt"][0]["content"]
    assert row["extra_info"]["answer"] == GSM8K[0]["answer"]
    with pytest.raises(ValueError, match="no '#### <number>' final line"):
        gsm8k.final_answer("just 7")
    with pytest.raises(ValueError, match="record 3 has no text field 'answer'"):
        gsm8k.convert({"question": "q"}, "train", 3)


def test_math_reference_answer():
    assert math_dataset.reference_answer(MATH[0], 0) == r"\frac{3}{4}"
    assert math_dataset.reference_answer({"problem": "p", "solution": "x", "answer": " 5 "}, 0) == "5"
    with pytest.raises(ValueError, match=r"record 4 has no 'answer' field and no \\boxed"):
        math_dataset.reference_answer({"problem": "p", "solution": "none"}, 4)
    with pytest.raises(ValueError, match="record 1 has no text field 'problem'"):
        math_dataset.convert({"question": "p"}, "test", 1)


def test_gsm8k_script_end_to_end_from_parquet(tmp_path):
    source = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(GSM8K), source)
    output = tmp_path / "out" / "train.parquet"
    subprocess.run([sys.executable, str(SCRIPTS / "gsm8k.py"), "--input", str(source), "--split", "train",
                    "--output", str(output)], check=True, cwd=ROOT, capture_output=True)
    rows = load_rows([str(output)])
    assert [r.ground_truth for r in rows] == ["7", "1200"] and rows[1].extra_info["index"] == 1
    assert default_compute_score(rows[1].data_source, "so\n#### 1,200", rows[1].ground_truth) == 1.0


def test_gsm8k_tool_rows_run_the_tool_agent_and_load_as_chat(tmp_path):
    """The GSM8K calculator preset's rows: a system message offering the tool, then gsm8k.py's user turn, and the
    row's agent loop named (verl's `agent_name` column)."""
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    output = tmp_path / "tool" / "train.parquet"
    subprocess.run([sys.executable, str(SCRIPTS / "gsm8k_tool.py"), "--input", str(source), "--split", "train",
                    "--output", str(output)], check=True, cwd=ROOT, capture_output=True)
    table = pq.read_table(output).to_pylist()
    assert [r["agent_name"] for r in table] == ["tool_agent", "tool_agent"]
    assert [m["role"] for m in table[0]["prompt"]] == ["system", "user"] and "calculator" in table[0]["prompt"][0][
        "content"]
    assert table[0]["prompt"][1] == gsm8k.convert(GSM8K[0], "train", 0)["prompt"][0]
    rows = load_rows([str(output)])
    assert [r.ground_truth for r in rows] == ["7", "1200"]


def test_math_script_from_a_folder_of_problem_files(tmp_path):
    for i, record in enumerate(MATH):
        folder = tmp_path / "MATH" / "test" / ("algebra" if i == 0 else "prealgebra")
        folder.mkdir(parents=True)
        (folder / f"{i}.json").write_text(json.dumps(record))
    output = tmp_path / "test.jsonl"
    math_dataset.main(["--input", str(tmp_path / "MATH"), "--split", "test", "--output", str(output)])
    rows = load_rows([str(output)])
    assert [r.ground_truth for r in rows] == [r"\frac{3}{4}", r"2\sqrt{2}"]
    assert rows[0].extra_info == {"split": "test", "index": 0, "level": "Level 1", "type": "Algebra"}
    assert default_compute_score(rows[0].data_source, r"\boxed{0.75}", rows[0].ground_truth) == 1.0


def test_reading_json_arrays_json_lines_named_json_and_jsonl(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(GSM8K))
    (tmp_path / "b.json").write_text("\n".join(json.dumps(r) for r in GSM8K))
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in GSM8K) + "\n")
    for name in ("a.json", "b.json", "c.jsonl"):
        assert read_source_records([tmp_path / name]) == GSM8K
    (tmp_path / "d.json").write_text("3")
    with pytest.raises(ValueError, match="a JSON int; expected an object"):
        read_source_records([tmp_path / "d.json"])


def test_source_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        source_files([tmp_path / "missing.jsonl"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .json/.jsonl/.parquet files in this folder"):
        source_files([tmp_path / "empty"])
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ValueError, match="unsupported input type '.csv'"):
        source_files([tmp_path / "x.csv"])


def test_write_rows_checks_rows_and_names(tmp_path):
    good = gsm8k.convert(GSM8K[0], "train", 0)
    with pytest.raises(ValueError, match="use a .parquet or .jsonl file name"):
        write_rows([good], tmp_path / "x.csv")
    with pytest.raises(ValueError, match="no rows to write"):
        write_rows([], tmp_path / "x.parquet")
    bad = {**good, "data_source": None}
    with pytest.raises(DataRowError, match=r"x.parquet row 1: field 'data_source' is None"):
        write_rows([good, bad], tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
