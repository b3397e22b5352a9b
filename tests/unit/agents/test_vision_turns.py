"""What an agent loop's image turn sends the engine and checks (experimental/agent_loop/vision_turns.py)."""

import pytest

from verl_like.experimental.agent_loop.vision_turns import ImageTurns, loop_image_data

IMG = 9  # the placeholder id
RAW = [1, IMG, 2]
EXPANDED = [1, 7, 8, IMG, IMG, IMG, 7, 2]  # what the engine makes of RAW


def row(**extra):
    return {"multi_modal_data": {"image": ["picture"]}, "raw_prompt_ids": RAW, "prompt_ids": EXPANDED, **extra}


def test_a_turn_after_the_datasets_prompt_is_sent_collapsed_and_its_expansion_checked():
    turns = ImageTurns.of_row(row(), IMG, "rollout row 0 sample 1")
    sent, new = turns.engine_ids(EXPANDED + [5, 6], ["picture"])
    assert (sent, new) == (RAW + [5, 6], False)
    turns.check(EXPANDED + [5, 6], sent, EXPANDED + [5, 6], new)
    with pytest.raises(ValueError, match="rollout row 0 sample 1: the engine expanded the image prompt to 3"):
        turns.check(EXPANDED + [5, 6], sent, [1, 5, 6], new)


def test_an_unexpanded_prompt_is_sent_as_it_is_and_its_expansion_collapses_later_turns():
    turns = ImageTurns.of_row({"multi_modal_data": {"image": ["picture"]}}, IMG, "s")
    template = [3, 1, IMG, 2]  # a loop's own chat template, one placeholder per image
    sent, new = turns.engine_ids(template, ["picture"])
    assert (sent, new) == (template, True)
    turns.check(template, sent, [3, *EXPANDED], new)
    assert turns.engine_ids([3, *EXPANDED, 4], ["picture"]) == ([3, 1, IMG, 2, 4], False)


def test_a_turn_with_more_placeholders_than_images_is_refused_naming_the_sample():
    turns = ImageTurns.of_row(row(), IMG, "rollout row 2 sample 0")
    with pytest.raises(ValueError, match="rollout row 2 sample 0: the turn's prompt holds 2 image placeholder"):
        turns.engine_ids(EXPANDED + [IMG], ["picture"])


def test_rows_without_images_have_no_image_turns():
    assert loop_image_data({"multi_modal_data": None}) is None
    assert ImageTurns.of_row({"prompt_ids": [1]}, IMG, "s") is None
