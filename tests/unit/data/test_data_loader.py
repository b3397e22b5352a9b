"""PromptLoader: seeded epoch orders, and a saved state that resumes at exactly the next batch."""

import json

import pytest

from verl_like.config.data import DataConfig
from verl_like.data.dataset import RLDataset
from verl_like.data.loader import PromptLoader
from verl_like.models.tiny import build_tokenizer


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("loader") / "d.jsonl"
    path.write_text("".join(
        json.dumps({"prompt": f"{i}+1=?", "ground_truth": str(i + 1), "data_source": "synthetic/add"}) + "\n"
        for i in range(10)
    ))
    return RLDataset([str(path)], build_tokenizer(), DataConfig(train_files=str(path), max_prompt_length=16))


def indices(batches):
    return [batch.non_tensor_batch["index"].tolist() for batch in batches]


def test_epoch_covers_every_prompt_once_and_drops_the_tail(dataset):
    loader = PromptLoader(dataset, 3, seed=7)
    assert len(loader) == 3
    epoch = indices(loader)
    flat = [i for batch in epoch for i in batch]
    assert len(flat) == 9 and len(set(flat)) == 9
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0


def test_keep_last_batch_for_validation(dataset):
    loader = PromptLoader(dataset, 4, shuffle=False, drop_last=False)
    assert len(loader) == 3
    assert indices(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_orders_depend_on_seed_and_epoch_only(dataset):
    a, b, c = PromptLoader(dataset, 5, seed=1), PromptLoader(dataset, 5, seed=1), PromptLoader(dataset, 5, seed=2)
    first_a, first_b, first_c = indices(a), indices(b), indices(c)
    assert first_a == first_b and first_a != first_c
    assert indices(a) != first_a  # epoch 1 has its own order


def test_resume_mid_epoch_continues_exactly(dataset):
    reference = PromptLoader(dataset, 3, seed=3)
    expected = [reference.next_batch().non_tensor_batch["index"].tolist() for _ in range(8)]

    run = PromptLoader(dataset, 3, seed=3)
    seen = [run.next_batch().non_tensor_batch["index"].tolist() for _ in range(4)]
    state = json.loads(json.dumps(run.state_dict()))  # the state survives a JSON round trip
    assert state == {"epoch": 1, "position": 1, "seed": 3, "shuffle": True, "batch_size": 3, "dataset_size": 10}

    resumed = PromptLoader(dataset, 3, seed=3)
    resumed.load_state_dict(state)
    seen += [resumed.next_batch().non_tensor_batch["index"].tolist() for _ in range(4)]
    assert seen == expected


def test_resume_through_iteration_after_a_break(dataset):
    loader = PromptLoader(dataset, 2, seed=0)
    for step, _ in enumerate(loader):
        if step == 1:
            break
    state = loader.state_dict()
    rest = indices(loader)
    resumed = PromptLoader(dataset, 2, seed=0)
    resumed.load_state_dict(state)
    assert indices(resumed) == rest and len(rest) == 3


def test_state_from_other_settings_is_refused(dataset):
    state = PromptLoader(dataset, 3, seed=3).state_dict()
    with pytest.raises(ValueError, match=r"saved with seed=3 but this loader has seed=4"):
        PromptLoader(dataset, 3, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved with batch_size=3 but this loader has batch_size=2"):
        PromptLoader(dataset, 2, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match=r"position=9 is outside 0..3"):
        PromptLoader(dataset, 3, seed=3).load_state_dict({**state, "position": 9})


def test_batch_larger_than_dataset_is_refused(dataset):
    with pytest.raises(ValueError, match=r"data.train_batch_size=11 is larger than the dataset \(10 prompts"):
        PromptLoader(dataset, 11)
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        PromptLoader(dataset, 0)
