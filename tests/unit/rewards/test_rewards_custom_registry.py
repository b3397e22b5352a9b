"""Custom reward functions from a file (and their errors), and the data_source -> scorer registry."""

from pathlib import Path

import pytest

from verl_like.data.synthetic import TASKS, data_source_of
from verl_like.rewards.custom import CustomRewardError, load_custom_function
from verl_like.rewards.registry import default_compute_score, get_scorer, register_scorer

FNS = str(Path(__file__).with_name("reward_fns.py"))


def test_load_custom_function():
    fn = load_custom_function(FNS, "misbehaving")
    assert fn(data_source="x", solution_str=" 5", ground_truth="5", extra_info=None) == 1.0
    assert load_custom_function(FNS, "takes_kwargs")(data_source="x", solution_str="abc", ground_truth="",
                                                     extra_info={}) == 3.0


def test_missing_file_names_the_existing_top_level_key():
    expected = r"'/no/such.py' does not exist; set custom_reward_function.path"
    with pytest.raises(CustomRewardError, match=expected) as info:
        load_custom_function("/no/such.py", "fn")
    assert "reward.custom_reward_function" not in str(info.value)


def test_missing_name_lists_the_callables():
    with pytest.raises(CustomRewardError, match=r"defines no 'score'; callables in it: \[.*'misbehaving'.*\]") as info:
        load_custom_function(FNS, "score")
    assert "; set custom_reward_function.name" in str(info.value)


def test_not_callable():
    with pytest.raises(CustomRewardError, match=r"'NOT_A_FUNCTION' .* is a int, not a function"):
        load_custom_function(FNS, "NOT_A_FUNCTION")


def test_wrong_signature():
    with pytest.raises(CustomRewardError, match=r"cannot take the reward arguments.*def fn\(data_source, solution_str"):
        load_custom_function(FNS, "wrong_signature")


def test_file_that_fails_to_import(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def fn(:\n")
    with pytest.raises(CustomRewardError, match=r"broken.py' failed to import: SyntaxError"):
        load_custom_function(str(broken), "fn")
    raising = tmp_path / "raising.py"
    raising.write_text("import not_a_module_anywhere\n")
    with pytest.raises(CustomRewardError, match=r"failed to import: ModuleNotFoundError"):
        load_custom_function(str(raising), "fn")


def test_directory_is_not_a_module(tmp_path):
    with pytest.raises(CustomRewardError, match="does not exist"):
        load_custom_function(str(tmp_path), "fn")


def test_registry_routes_by_data_source():
    assert default_compute_score("openai/gsm8k", "#### 12", "12") == 1.0
    assert default_compute_score("openai/gsm8k", "12", "12") == 0.0
    assert default_compute_score("lighteval/MATH", r"\boxed{\frac{2}{4}}", "0.5") == 1.0
    assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", r"\boxed{3}", "4") == 0.0
    for name, task in TASKS.items():
        if task.answer_prefix is None:
            assert default_compute_score(data_source_of(name), "85", "85", {"split": "test"}) == 1.0
        else:  # multi-turn tasks score the text after the last answer prefix (tool replies come before it)
            text = f"{{...}}84{task.answer_prefix} 85"
            assert default_compute_score(data_source_of(name), text, "85", {"split": "test"}) == 1.0
            assert default_compute_score(data_source_of(name), "85", "85", {"split": "test"}) == 0.0


def test_unknown_data_source():
    expected = r"no rule scorer for data_source 'mine'.*or set custom_reward_function.path and custom_reward_function.name"
    with pytest.raises(KeyError, match=expected):
        get_scorer("mine")


def test_register_scorer_and_refuse_a_second_one_for_the_same_source():
    @register_scorer("tests/len")
    def by_length(solution_str, ground_truth):
        return float(len(solution_str) == int(ground_truth))

    assert default_compute_score("tests/len", "abc", "3") == 1.0
    with pytest.raises(ValueError, match="'tests/len' is already registered"):
        register_scorer("tests/len")(lambda s, g: 0.0)


def test_file_that_is_not_a_python_module(tmp_path):
    text = tmp_path / "reward.txt"
    text.write_text("def fn(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    with pytest.raises(CustomRewardError, match=r"reward.txt' is not a Python module; give a .py file"):
        load_custom_function(str(text), "fn")
