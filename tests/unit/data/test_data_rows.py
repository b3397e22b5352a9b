"""Bad data files and rows: each stops the dataset with a message naming the file, row, field and the fix."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_like.config.data import DataConfig
from verl_like.data.dataset import RLDataset
from verl_like.data.rows import DataRowError, check_record, load_rows, read_records
from verl_like.models.tiny import build_tokenizer

GOOD = {"prompt": [{"role": "user", "content": "1+2=?"}], "reward_model": {"ground_truth": "3"}, "data_source": "x"}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def with_(**changes):
    record = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is _DELETE:
            record.pop(key)
        else:
            record[key] = value
    return record


_DELETE = object()

BAD_ROWS = [
    # (record, fragments the message must contain)
    (with_(prompt=_DELETE), ["row 1", "'prompt' is missing", "data.prompt_key"]),
    (with_(prompt=None), ["row 1", "'prompt' is missing"]),
    (with_(prompt=7), ["row 1", "'prompt' is a int", "list of chat messages"]),
    (with_(prompt=""), ["row 1", "empty string"]),
    (with_(prompt=[]), ["row 1", "empty list", "at least one chat message"]),
    (with_(prompt=["hi"]), ["row 1", "'prompt[0]' is a str", "role"]),
    (with_(prompt=[{"content": "hi"}]), ["row 1", "'prompt[0].role' is missing"]),
    (with_(prompt=[{"role": "user"}]), ["row 1", "'prompt[0].content' is missing"]),
    (with_(prompt=[{"role": "robot", "content": "hi"}]), ["row 1", "'prompt[0].role' is 'robot'", "system"]),
    (with_(prompt=[{"role": "user", "content": 5}]), ["row 1", "'prompt[0].content' is a int", "text"]),
    (with_(reward_model=_DELETE), ["row 1", "reward_model.ground_truth", "reference answer"]),
    (with_(reward_model={"style": "rule"}), ["row 1", "reward_model.ground_truth", "missing or null"]),
    (with_(reward_model="3"), ["row 1", "'reward_model' is a str", "ground_truth"]),
    (with_(data_source=_DELETE), ["row 1", "'data_source' is None", "data.reward_fn_key"]),
    (with_(data_source=""), ["row 1", "'data_source' is ''"]),
    (with_(extra_info=[1, 2]), ["row 1", "'extra_info' is a list"]),
]


@pytest.mark.parametrize("record, fragments", BAD_ROWS)
def test_bad_row_names_file_row_field_and_fix(tmp_path, record, fragments):
    path = write_jsonl(tmp_path / "data.jsonl", [GOOD, record])
    with pytest.raises(DataRowError) as info:
        load_rows([str(path)])
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_top_level_ground_truth_and_text_prompt_are_accepted():
    row = check_record({"prompt": "2+2=?", "ground_truth": 4, "data_source": "x"}, "f.jsonl", 0)
    assert row.prompt == "2+2=?" and row.ground_truth == 4 and row.extra_info == {}


def test_reward_model_ground_truth_wins_over_top_level():
    row = check_record(with_(ground_truth="9"), "f.jsonl", 0)
    assert row.ground_truth == "3"


def test_custom_prompt_and_data_source_keys(tmp_path):
    record = {"question": "1+1=?", "ground_truth": "2", "task": "mine"}
    path = write_jsonl(tmp_path / "d.jsonl", [record])
    [row] = load_rows([str(path)], prompt_key="question", reward_fn_key="task")
    assert row.prompt == "1+1=?" and row.data_source == "mine"


def test_invalid_json_line_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n{not json\n")
    with pytest.raises(DataRowError, match=r"d.jsonl line 3: not valid JSON"):
        read_records(path)


def test_json_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(DataRowError, match=r"line 1: a JSON list, not an object"):
        read_records(path)


def test_unsupported_suffix_missing_and_empty_files(tmp_path):
    with pytest.raises(DataRowError, match=r"unsupported file type '.csv'.*data_preprocess"):
        read_records(tmp_path / "d.csv")
    with pytest.raises(DataRowError, match=r"no such file"):
        read_records(tmp_path / "missing.parquet")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataRowError, match=r"holds no rows"):
        read_records(tmp_path / "empty.jsonl")


def test_corrupt_parquet_file(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataRowError, match=r"bad.parquet: not a readable parquet file"):
        read_records(path)


def test_parquet_rows_read_as_plain_python(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([with_(extra_info={"index": 2}), with_(extra_info={"index": 3})]), path)
    rows = load_rows([str(path)])
    assert rows[0].prompt == GOOD["prompt"] and rows[1].extra_info == {"index": 3}
    assert rows[1].row_index == 1 and rows[1].file == str(path)


def test_chat_template_rejection_names_the_row(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [with_(prompt=[{"role": "tool", "content": "x"}])])
    with pytest.raises(DataRowError, match=r"d.jsonl row 0: the chat template rejected field 'prompt'"):
        RLDataset([str(path)], build_tokenizer(), DataConfig(train_files=str(path)))


def test_messages_with_apply_chat_template_off(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD])
    config = DataConfig(train_files=str(path), apply_chat_template=False)
    with pytest.raises(DataRowError, match=r"row 0: .*holds chat messages but data.apply_chat_template=false"):
        RLDataset([str(path)], build_tokenizer(), config)


def test_prompt_with_no_encodable_characters(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [with_(prompt="ÄÖÜ")])
    config = DataConfig(train_files=str(path), apply_chat_template=False)
    with pytest.raises(DataRowError, match=r"row 0: field 'prompt' tokenizes to no tokens"):
        RLDataset([str(path)], build_tokenizer(), config)


def test_overlong_prompt_with_truncation_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, with_(prompt="1" * 40)])
    config = DataConfig(train_files=str(path), max_prompt_length=16, truncation="error")
    with pytest.raises(DataRowError, match=r"row 1: field 'prompt' is 44 tokens .*max_prompt_length=16.*truncation"):
        RLDataset([str(path)], build_tokenizer(), config)
