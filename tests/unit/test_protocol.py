"""DataProto: every operation and every error path, on bool/int/float/bfloat16 tensors and 0-length edge cases."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl_like.protocol import DataProto, DataProtoItem, pad_to_divisor, unpad
from verl_like.protocol_ops import values_equal

DTYPES = [torch.bool, torch.int32, torch.int64, torch.float32, torch.float64, torch.bfloat16]


def make(rows: int = 5, meta: dict | None = None) -> DataProto:
    """Rows whose every column encodes the row number, so that any row mix-up shows in the values."""
    ids = torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "log_probs": ids.to(torch.float32) / 2,
            "ref_log_probs": ids[:, 0].to(torch.bfloat16),
            "mask": ids[:, 0] % 2 == 0,
        },
        non_tensors={"prompt": [f"p{i}" for i in range(rows)], "answer": [[i, i] for i in range(rows)]},
        meta_info=meta if meta is not None else {"temperature": 1.0},
    )


def rows_of(data: DataProto) -> list[int]:
    """The original row numbers a DataProto built by `make` holds, read from a tensor and checked on the others."""
    rows = (data.batch["input_ids"][:, 0] // 3).tolist()
    assert [int(p[1:]) for p in data.non_tensor_batch["prompt"]] == rows
    assert [a[0] for a in data.non_tensor_batch["answer"]] == rows
    assert torch.equal(data.batch["log_probs"], data.batch["input_ids"].float() / 2)
    assert torch.equal(data.batch["mask"], data.batch["input_ids"][:, 0] % 2 == 0)
    return rows


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b)
    assert set(a.batch.keys()) == set(b.batch.keys())
    for key in a.batch.keys():
        assert a.batch[key].dtype == b.batch[key].dtype, key
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert values_equal(a.non_tensor_batch, b.non_tensor_batch)
    assert values_equal(a.meta_info, b.meta_info)


# ---------------------------------------------------------------------------------------------- construction


def test_from_dict_builds_rows_and_object_columns():
    data = make(4)
    assert len(data) == 4
    assert data.batch.batch_size == torch.Size([4])
    answer = data.non_tensor_batch["answer"]
    assert answer.dtype == object and answer.shape == (4,) and answer[2] == [2, 2]
    assert data.meta_info == {"temperature": 1.0}
    assert "input_ids: int64[4, 3]" in repr(data) and "prompt" in repr(data)


def test_from_dict_keeps_numpy_columns_as_given():
    scores = np.arange(3, dtype=np.float32)
    data = DataProto.from_dict(non_tensors={"score": scores})
    assert len(data) == 3 and data.non_tensor_batch["score"] is scores and len(data.batch.keys()) == 0


@pytest.mark.parametrize(
    "tensors, non_tensors, message",
    [
        ({"a": torch.zeros(4), "b": torch.zeros(3)}, None, "{'a': 4, 'b': 3}"),
        ({"a": torch.zeros(4)}, {"prompt": ["x", "y"]}, "{'a': 4, 'prompt': 2}"),
        ({"a": torch.tensor(1.0)}, None, "tensors['a'] is a 0-d tensor"),
    ],
)
def test_from_dict_rejects_mismatched_rows(tensors, non_tensors, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("{", r"\{").replace("}", r"\}")):
        DataProto.from_dict(tensors, non_tensors)


@pytest.mark.parametrize(
    "tensors, non_tensors, message",
    [
        ({"a": [1, 2]}, None, r"tensors\['a'\] is a list, not a tensor"),
        (None, {"prompt": "abc"}, r"non_tensors\['prompt'\] is a str"),
        (None, {"prompt": torch.zeros(2)}, r"non_tensors\['prompt'\] is a Tensor"),
    ],
)
def test_from_dict_rejects_wrong_types(tensors, non_tensors, message):
    with pytest.raises(TypeError, match=message):
        DataProto.from_dict(tensors, non_tensors)


def test_meta_only_and_empty_protos_have_no_rows():
    assert len(DataProto()) == 0
    meta_only = DataProto(meta_info={"metrics": {"loss": 1.0}})
    assert len(meta_only) == 0 and meta_only.meta_info["metrics"] == {"loss": 1.0}
    assert len(DataProto.from_dict(meta_info={"step": 3})) == 0
    zero_rows = DataProto.from_dict({"ids": torch.zeros(0, 7, dtype=torch.int64)}, {"prompt": []})
    assert len(zero_rows) == 0 and zero_rows.batch["ids"].shape == (0, 7)


def test_constructor_takes_rows_from_non_tensor_columns_and_copies_dicts():
    columns = {"uid": np.array(["a", "b"], dtype=object)}
    meta = {"step": 1}
    data = DataProto(non_tensor_batch=columns, meta_info=meta)
    assert len(data) == 2
    columns["other"] = np.zeros(5)
    meta["step"] = 2
    assert "other" not in data.non_tensor_batch and data.meta_info["step"] == 1


def test_constructor_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"exactly one batch dimension.*batch_size=\[2, 3\]"):
        DataProto(TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))
    with pytest.raises(TypeError, match=r"DataProto.batch\['inner'\] is a TensorDict"):
        DataProto(TensorDict({"inner": TensorDict({"a": torch.zeros(2)}, batch_size=[2])}, batch_size=[2]))
    with pytest.raises(TypeError, match="must be a TensorDict, got dict"):
        DataProto({"a": torch.zeros(2)})
    with pytest.raises(TypeError, match=r"non_tensor_batch\['uid'\] is a list"):
        DataProto(TensorDict({}, batch_size=[2]), {"uid": ["a", "b"]})
    with pytest.raises(ValueError, match=r"row counts \{'uid': 3, 'score': 2\} do not match the batch's 2 rows"):
        DataProto(TensorDict({"a": torch.zeros(2)}, batch_size=[2]), {"uid": np.zeros(3), "score": np.zeros(2)})
    with pytest.raises(ValueError, match=r"row counts \{'scalar': -1\}"):
        DataProto(TensorDict({}, batch_size=[0]), {"scalar": np.array(1.0)})
    with pytest.raises(ValueError, match=r"keys \['a'\] are in both batch and non_tensor_batch"):
        DataProto(TensorDict({"a": torch.zeros(2)}, batch_size=[2]), {"a": np.zeros(2)})


def test_check_consistency_catches_later_edits():
    data = make(3)
    data.non_tensor_batch["late"] = np.zeros(4)
    with pytest.raises(ValueError, match=r"\{'prompt': 3, 'answer': 3, 'late': 4\}"):
        data.check_consistency()
    data = make(3)
    data.meta_info = [1]
    with pytest.raises(TypeError, match="must be dicts"):
        data.check_consistency()


# ---------------------------------------------------------------------------------------------- indexing


def test_int_index_gives_a_row_item():
    data = make(4)
    item = data[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch.batch_size == torch.Size([])
    assert item.batch["input_ids"].tolist() == [6, 7, 8]
    assert item.non_tensor_batch == {"prompt": "p2", "answer": [2, 2]}
    assert item.meta_info == {"temperature": 1.0}
    assert data[-1].non_tensor_batch["prompt"] == "p3"
    assert data[np.int64(1)].non_tensor_batch["prompt"] == "p1"
    assert [item.non_tensor_batch["prompt"] for item in data] == ["p0", "p1", "p2", "p3"]


@pytest.mark.parametrize("index", [4, -5])
def test_int_index_out_of_range(index):
    with pytest.raises(IndexError, match=rf"DataProto\[{index}\]: index out of range for a batch of 4 rows"):
        make(4)[index]


@pytest.mark.parametrize(
    "index, expected",
    [
        (slice(1, 4), [1, 2, 3]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(None, None, -1), [4, 3, 2, 1, 0]),
        (slice(3, 3), []),
        ([4, 0, 0, -1], [4, 0, 0, 4]),
        ([], []),
        ((1, 2), [1, 2]),
        (np.array([3, 1]), [3, 1]),
        (np.array([3, 1], dtype=np.int32), [3, 1]),
        (torch.tensor([2, 2]), [2, 2]),
        ([True, False, True, False, True], [0, 2, 4]),
        (np.array([False] * 5), []),
        (torch.tensor([False, True, False, False, True]), [1, 4]),
    ],
)
def test_index_selects_rows(index, expected):
    picked = make(5)[index]
    assert isinstance(picked, DataProto)
    assert rows_of(picked) == expected
    assert picked.meta_info == {"temperature": 1.0}


def test_slice_is_a_view_and_list_index_a_copy():
    data = make(5)
    data[1:3].batch["input_ids"][0, 0] = -1
    assert data.batch["input_ids"][1, 0] == -1
    data[[1]].batch["input_ids"][0, 0] = -7
    assert data.batch["input_ids"][1, 0] == -1


@pytest.mark.parametrize(
    "index, error, message",
    [
        ([0, 5], IndexError, r"indices \[5\] are out of range for a batch of 5 rows"),
        ([-6], IndexError, r"indices \[-6\] are out of range"),
        ([True, False], IndexError, "bool mask has 2 entries but the batch has 5 rows"),
        (np.zeros((2, 2), dtype=np.int64), IndexError, r"index must be 1-D, got shape \(2, 2\)"),
        (np.array([0.0, 1.0]), TypeError, "must hold ints or bools, got dtype float64"),
        ("a", TypeError, "cannot index with str"),
        (True, TypeError, "a bare bool is not an index"),
    ],
)
def test_bad_indices_raise(index, error, message):
    with pytest.raises(error, match=message):
        make(5)[index]


# ---------------------------------------------------------------------------------------------- select / pop / rename


def test_select_keeps_named_keys_and_shares_tensors():
    data = make(3, meta={"temperature": 1.0, "step": 4})
    picked = data.select(["input_ids"], "prompt", ["step"])
    assert list(picked.batch.keys()) == ["input_ids"]
    assert list(picked.non_tensor_batch) == ["prompt"] and picked.meta_info == {"step": 4}
    assert picked.batch["input_ids"].data_ptr() == data.batch["input_ids"].data_ptr()
    picked.batch["extra"] = torch.zeros(3)
    assert "extra" not in data.batch.keys()
    everything = data.select()
    assert_same(everything, data)
    nothing = data.select([], [], [])
    assert len(nothing) == 3 and not nothing.batch.keys() and not nothing.non_tensor_batch and not nothing.meta_info


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_keys": ["foo"]}, "DataProto.select: batch has no key 'foo'; available: "
         "['input_ids', 'log_probs', 'mask', 'ref_log_probs']"),
        ({"non_tensor_keys": ["uid"]}, "DataProto.select: non_tensor_batch has no key 'uid'; available: "
         "['answer', 'prompt']"),
        ({"meta_keys": "step"}, "DataProto.select: meta_info has no key 'step'; available: ['temperature']"),
    ],
)
def test_select_missing_key_names_it_and_the_available_ones(kwargs, message):
    with pytest.raises(KeyError) as error:
        make(3).select(**kwargs)
    assert error.value.args[0] == message


def test_pop_removes_from_self_and_returns_the_removed():
    data = make(3, meta={"temperature": 1.0, "step": 4})
    popped = data.pop(batch_keys=["log_probs", "mask"], non_tensor_keys="answer", meta_keys=["step"])
    assert sorted(popped.batch.keys()) == ["log_probs", "mask"] and len(popped) == 3
    assert list(popped.non_tensor_batch) == ["answer"] and popped.meta_info == {"step": 4}
    assert sorted(data.batch.keys()) == ["input_ids", "ref_log_probs"]
    assert list(data.non_tensor_batch) == ["prompt"] and data.meta_info == {"temperature": 1.0}
    nothing = data.pop()
    assert len(nothing) == 3 and not nothing.batch.keys()
    assert sorted(data.batch.keys()) == ["input_ids", "ref_log_probs"]


def test_pop_with_a_missing_key_changes_nothing():
    data = make(3)
    with pytest.raises(KeyError, match="DataProto.pop: batch has no key 'nope'"):
        data.pop(batch_keys=["input_ids", "nope"])
    assert "input_ids" in data.batch.keys()


def test_rename_moves_columns_and_can_swap():
    data = make(3)
    renamed = data.rename(["log_probs", "prompt"], ["old_log_probs", "raw_prompt"])
    assert "old_log_probs" in renamed.batch.keys() and "log_probs" not in renamed.batch.keys()
    assert list(renamed.non_tensor_batch["raw_prompt"]) == ["p0", "p1", "p2"]
    assert "log_probs" in data.batch.keys() and "prompt" in data.non_tensor_batch
    swapped = data.rename(["input_ids", "log_probs"], ["log_probs", "input_ids"])
    assert swapped.batch["log_probs"].dtype == torch.int64 and swapped.batch["input_ids"].dtype == torch.float32
    assert data.rename("mask", "response_mask").batch["response_mask"].dtype == torch.bool


@pytest.mark.parametrize(
    "old, new, message",
    [
        (["mask"], ["a", "b"], r"1 old keys \['mask'\] but 2 new keys"),
        (["nope"], ["a"], "DataProto.rename: the batch or non_tensor_batch has no key 'nope'"),
        (["mask"], ["input_ids"], "makes two columns share a name"),
        (["mask"], ["prompt"], "makes two columns share a name"),
        (["mask", "prompt"], ["x", "x"], "makes two columns share a name"),
    ],
)
def test_rename_errors(old, new, message):
    with pytest.raises((KeyError, ValueError), match=message):
        make(3).rename(old, new)


# ---------------------------------------------------------------------------------------------- union


def test_union_merges_keys_and_accepts_equal_duplicates():
    data = make(4)
    left = data.select(["input_ids", "log_probs"], ["prompt"], [])
    right = data.select(["input_ids", "mask"], ["answer"])
    right.meta_info["step"] = 2
    both = left.union(right)
    assert sorted(both.batch.keys()) == ["input_ids", "log_probs", "mask"]
    assert sorted(both.non_tensor_batch) == ["answer", "prompt"]
    assert both.meta_info == {"temperature": 1.0, "step": 2}
    assert sorted(left.batch.keys()) == ["input_ids", "log_probs"]  # union does not change its operands
    nan = DataProto.from_dict({"x": torch.tensor([float("nan"), 1.0])}, meta_info={"m": float("nan")})
    nan_copy = DataProto.from_dict({"x": torch.tensor([float("nan"), 1.0])}, meta_info={"m": float("nan")})
    assert torch.isnan(nan.union(nan_copy).batch["x"][0])


@pytest.mark.parametrize(
    "other_kwargs, message",
    [
        ({"tensors": {"input_ids": torch.zeros(4, 3, dtype=torch.int64)}}, r"batch\['input_ids'\] differs"),
        ({"non_tensors": {"prompt": ["p0", "p1", "p2", "other"]}}, r"non_tensor_batch\['prompt'\] differs"),
        ({"meta_info": {"temperature": 0.5}}, r"meta_info\['temperature'\] differs"),
        ({"tensors": {"prompt": torch.zeros(4)}}, r"keys \['prompt'\] are in both batch and non_tensor_batch"),
        ({"tensors": {"x": torch.zeros(3)}}, "self has 4 rows but other has 3"),
    ],
)
def test_union_conflicts_name_the_key(other_kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(4).union(DataProto.from_dict(**other_kwargs))


def test_union_with_a_meta_only_proto_fits_any_length():
    data = make(4)
    merged = data.union(DataProto(meta_info={"step": 9}))
    assert len(merged) == 4 and merged.meta_info["step"] == 9
    merged = DataProto(meta_info={"step": 9}).union(data)
    assert len(merged) == 4 and rows_of(merged) == [0, 1, 2, 3] and merged.meta_info["temperature"] == 1.0


# ---------------------------------------------------------------------------------------------- chunk / split / pad


def test_chunk_gives_equal_views_that_concat_back():
    data = make(6)
    chunks = data.chunk(3)
    assert [rows_of(c) for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert all(c.meta_info == {"temperature": 1.0} for c in chunks)
    assert_same(DataProto.concat(chunks), data)
    chunks[1].batch["input_ids"][0, 1] = -3
    assert data.batch["input_ids"][2, 1] == -3


def test_chunk_requires_divisibility_and_points_to_padding():
    with pytest.raises(ValueError, match=r"5 rows do not split evenly into 2 chunks; pad first with .*pad_to_divisor"):
        make(5).chunk(2)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=f"chunks={bad!r} must be a positive int"):
            make(4).chunk(bad)


def test_chunk_of_empty_and_meta_only_protos():
    chunks = make(0).chunk(3)
    assert [len(c) for c in chunks] == [0, 0, 0] and all("input_ids" in c.batch.keys() for c in chunks)
    meta_chunks = DataProto(meta_info={"step": 1}).chunk(2)
    assert [c.meta_info for c in meta_chunks] == [{"step": 1}, {"step": 1}]


@pytest.mark.parametrize("rows, divisor, pad", [(5, 2, 1), (1, 4, 3), (3, 8, 5), (6, 3, 0), (0, 4, 0)])
def test_pad_chunk_process_concat_unpad_equals_processing_the_whole(rows, divisor, pad):
    data = make(rows)
    padded, pad_size = pad_to_divisor(data, divisor)
    assert pad_size == pad and len(padded) % divisor == 0
    assert rows_of(padded) == [i % rows for i in range(rows + pad)]
    if pad == 0:
        assert padded is data
    results = []
    for chunk in padded.chunk(divisor):  # what one worker does with its chunk
        out = DataProto.from_dict({"doubled": chunk.batch["log_probs"] * 2}, meta_info={"metrics": {"n": len(chunk)}})
        results.append(out)
    collected = unpad(DataProto.concat(results), pad_size)
    assert torch.equal(collected.batch["doubled"], data.batch["log_probs"] * 2)
    assert collected.meta_info["metrics"]["n"] == [len(padded) // divisor] * divisor


@pytest.mark.parametrize("pad_size", [-1, 4, 1.0])
def test_unpad_rejects_bad_pad_size(pad_size):
    with pytest.raises(ValueError, match=rf"pad_size={pad_size!r} must be an int in \[0, 3\]"):
        unpad(make(3), pad_size)


def test_unpad_zero_returns_the_same_object_and_pad_rejects_bad_divisor():
    data = make(3)
    assert unpad(data, 0) is data
    assert rows_of(unpad(data, 3)) == []
    with pytest.raises(ValueError, match="divisor=0 must be a positive int"):
        pad_to_divisor(data, 0)


def test_split_gives_consecutive_parts():
    assert [rows_of(p) for p in make(7).split(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [rows_of(p) for p in make(4).split(10)] == [[0, 1, 2, 3]]
    empty_parts = make(0).split(2)
    assert len(empty_parts) == 1 and len(empty_parts[0]) == 0
    with pytest.raises(ValueError, match="split_size=0 must be a positive int"):
        make(3).split(0)


# ---------------------------------------------------------------------------------------------- concat


def test_concat_merges_meta_and_metrics_into_lists():
    parts = [make(2)[[0, 1]], make(4)[[2, 3]], make(4)[[]]]
    parts[0].meta_info["metrics"] = {"loss": 1.0, "grad_norm": [0.5, 0.25]}
    parts[1].meta_info["metrics"] = {"loss": 2.0}
    parts[2].meta_info["metrics"] = {"loss": 3.0, "grad_norm": [0.75]}
    whole = DataProto.concat(parts)
    assert rows_of(whole) == [0, 1, 2, 3]
    assert whole.meta_info == {"temperature": 1.0, "metrics": {"loss": [1.0, 2.0, 3.0], "grad_norm": [0.5, 0.25, 0.75]}}
    assert parts[0].meta_info["metrics"]["grad_norm"] == [0.5, 0.25]  # inputs untouched
    nested = DataProto.concat([DataProto.concat(parts[:2]), parts[2]])
    assert nested.meta_info == whole.meta_info


def test_concat_of_meta_only_worker_results_collects_metrics():
    results = [DataProto(meta_info={"metrics": {"actor/loss": float(rank)}, "step": 5}) for rank in range(3)]
    merged = DataProto.concat(results)
    assert len(merged) == 0 and merged.meta_info == {"metrics": {"actor/loss": [0.0, 1.0, 2.0]}, "step": 5}


def test_concat_keeps_keys_present_in_only_some_parts():
    a, b = make(1), make(1)
    b.meta_info["only_b"] = "x"
    assert DataProto.concat([a, b]).meta_info == {"temperature": 1.0, "only_b": "x"}


@pytest.mark.parametrize(
    "edit, error, message",
    [
        (lambda d: d.meta_info.update(temperature=0.7), ValueError,
         r"meta_info\['temperature'\] differs between parts \(part 0: 1.0, part 1: 0.7\)"),
        (lambda d: d.meta_info.update(metrics=[1.0]), TypeError, r"meta_info\['metrics'\] of part 1 is a list"),
        (lambda d: d.pop(batch_keys=["mask"]), ValueError,
         r"part 1 has batch keys .* but part 0 has .*; missing \['mask'\], extra \[\]"),
        (lambda d: d.non_tensor_batch.update(uid=np.zeros(2)), ValueError,
         r"part 1 has non_tensor_batch keys .*extra \['uid'\]"),
        (lambda d: d.batch.set("mask", d.batch["mask"].long()), ValueError,
         r"batch\['mask'\] has different dtypes or trailing shapes per part: \['bool\[2\]', 'int64\[2\]'\]"),
        (lambda d: d.batch.set("input_ids", torch.zeros(2, 4, dtype=torch.int64)), ValueError,
         r"batch\['input_ids'\] has different dtypes or trailing shapes"),
        (lambda d: d.non_tensor_batch.update(answer=np.zeros((2, 2))), ValueError,
         r"non_tensor_batch\['answer'\] has different trailing shapes"),
    ],
)
def test_concat_errors_name_the_key_and_part(edit, error, message):
    second = make(2)
    edit(second)
    with pytest.raises(error, match=message):
        DataProto.concat([make(2), second])


def test_concat_of_nothing_raises():
    with pytest.raises(ValueError, match="got no parts"):
        DataProto.concat([])


# ---------------------------------------------------------------------------------------------- repeat / reorder / to


def test_repeat_interleaved_and_tiled():
    data = make(3)
    assert rows_of(data.repeat(2)) == [0, 0, 1, 1, 2, 2]
    assert rows_of(data.repeat(2, interleave=False)) == [0, 1, 2, 0, 1, 2]
    assert rows_of(data.repeat(1)) == [0, 1, 2]
    assert len(make(0).repeat(4)) == 0
    with pytest.raises(ValueError, match="repeat_times=0 must be a positive int"):
        data.repeat(0)


def test_reorder_applies_a_permutation():
    data = make(4)
    assert rows_of(data.reorder([2, 0, 3, 1])) == [2, 0, 3, 1]
    assert rows_of(data.reorder(torch.tensor([3, 2, 1, 0]))) == [3, 2, 1, 0]
    assert rows_of(data) == [0, 1, 2, 3]
    assert len(make(0).reorder([])) == 0
    for bad in ([0, 0, 1, 2], [0, 1, 2], slice(None)):
        with pytest.raises(ValueError, match=r"must be a permutation of range\(4\)"):
            data.reorder(bad)
    with pytest.raises(IndexError, match=r"DataProto.reorder: indices \[4\] are out of range"):
        data.reorder([1, 2, 3, 4])


def test_to_moves_tensors_and_keeps_the_rest():
    data = make(2)
    moved = data.to("meta")  # the meta device exists on every machine; it proves the tensors really move
    assert all(t.device.type == "meta" for t in moved.batch.values())
    assert moved.non_tensor_batch["prompt"] is data.non_tensor_batch["prompt"] and moved.meta_info == data.meta_info
    assert all(t.device.type == "cpu" for t in data.batch.values())
    assert_same(data.to("cpu"), data)


# ---------------------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_operation_keeps_dtype_and_values(dtype):
    values = (torch.arange(12).reshape(6, 2) % 3).to(dtype)
    data = DataProto.from_dict({"x": values})
    checks = {
        "index": (data[[5, 0]], values[[5, 0]]),
        "mask": (data[np.arange(6) % 2 == 0], values[::2]),
        "repeat": (data.repeat(2, interleave=False), torch.cat([values, values])),
        "concat": (DataProto.concat(data.chunk(3)), values),
        "pad": (pad_to_divisor(data, 4)[0], torch.cat([values, values[:2]])),
        "pickle": (pickle.loads(pickle.dumps(data)), values),
    }
    for name, (got, expected) in checks.items():
        assert got.batch["x"].dtype == dtype, name
        assert torch.equal(got.batch["x"], expected), name
    assert data[4].batch["x"].dtype == dtype


# ---------------------------------------------------------------------------------------------- serialization


@pytest.mark.parametrize("protocol", [4, 5])
def test_pickle_round_trip(protocol):
    data = make(5, meta={"metrics": {"loss": [1.0]}, "tensor_meta": torch.ones(2)})
    data.non_tensor_batch["score"] = np.linspace(0, 1, 5)
    data.batch["strided"] = torch.arange(20.0).reshape(4, 5).t()  # non-contiguous view
    data.batch["grad"] = torch.ones(5, requires_grad=True)
    restored = pickle.loads(pickle.dumps(data, protocol=protocol))
    assert_same(restored, data)
    assert not restored.batch["grad"].requires_grad
    restored.batch["input_ids"].add_(1)  # own, writable memory
    assert not torch.equal(restored.batch["input_ids"], data.batch["input_ids"])


@pytest.mark.parametrize(
    "data",
    [DataProto(), DataProto(meta_info={"step": 1}), make(0), DataProto.from_dict(non_tensors={"uid": ["a"]})],
    ids=["empty", "meta-only", "zero-rows", "non-tensor-only"],
)
def test_pickle_round_trip_edge_cases(data):
    assert_same(pickle.loads(pickle.dumps(data, protocol=5)), data)
    assert_same(copy.deepcopy(data), data)


def test_protocol5_ships_each_tensor_out_of_band_and_restores_writable_columns():
    data = make(4)
    data.non_tensor_batch["score"] = np.arange(4.0)
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
    tensor_bytes = sum(t.numel() * t.element_size() for t in data.batch.values())
    assert len(buffers) == len(data.batch.keys()) + 1  # one per tensor, one for the numeric column
    assert sum(memoryview(b).nbytes for b in buffers) == tensor_bytes + data.non_tensor_batch["score"].nbytes
    read_only = [memoryview(b).toreadonly() for b in buffers]  # how Ray hands buffers back from its store
    restored = pickle.loads(payload, buffers=read_only)
    assert_same(restored, data)
    restored.batch["log_probs"].mul_(2)
    restored.non_tensor_batch["score"][0] = 9.0
    assert data.non_tensor_batch["score"][0] == 0.0 and data.batch["log_probs"][1, 0] == 1.5
    aliased_buffers = pickle.loads(payload, buffers=buffers)  # writable buffers that are the source's own memory
    aliased_buffers.batch["input_ids"].add_(1)
    assert data.batch["input_ids"][0, 0] == 0


def test_deepcopy_is_independent():
    data = make(3)
    clone = copy.deepcopy(data)
    clone.batch["input_ids"].zero_()
    clone.non_tensor_batch["answer"][0].append(99)
    assert rows_of(data) == [0, 1, 2] and data.non_tensor_batch["answer"][0] == [0, 0]


# ---------------------------------------------------------------------------------------------- values_equal


@pytest.mark.parametrize(
    "a, b, equal",
    [
        (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]), True),
        (torch.tensor([1, 2]), torch.tensor([1.0, 2.0]), False),
        (torch.tensor([1, 2]), np.array([1, 2]), False),
        (torch.tensor([1, 2]), torch.tensor([1, 2, 3]), False),
        (np.array(["a", "b"]), np.array(["a", "b"]), True),
        (np.array([1.0, np.nan]), np.array([1.0, np.nan]), True),
        (np.array([[1], "x"], dtype=object), np.array([[1], "x"], dtype=object), True),
        (np.array([np.zeros(2), 1], dtype=object), np.array([np.ones(2), 1], dtype=object), False),
        ({"a": [1, 2]}, {"a": [1, 2]}, True),
        ({"a": 1}, {"b": 1}, False),
        ([1, 2], (1, 2), False),
        (float("nan"), float("nan"), True),
        ("x", "y", False),
    ],
)
def test_values_equal(a, b, equal):
    assert values_equal(a, b) is equal
