"""TrainRequest: the typed form of a rollout batch's temperature, lr_scale and weight version (pure logic)."""

from __future__ import annotations

from verl_like.workers.train_request import TrainRequest


def test_a_request_round_trips_through_meta_info_under_the_keys_users_read():
    request = TrainRequest(temperature=0.7, lr_scale=0.5, weight_version=3)
    meta = request.to_meta_info()
    assert meta == {"temperature": 0.7, "lr_scale": 0.5, "weight_version": 3}
    assert TrainRequest.from_meta_info(meta) == request


def test_defaults_add_no_keys_and_absent_keys_read_as_defaults():
    assert TrainRequest().to_meta_info() == {}
    assert TrainRequest.from_meta_info({"seed": 1, "metrics": {}}) == TrainRequest(None, 1.0, None)


def test_values_are_parsed_to_their_types():
    request = TrainRequest.from_meta_info({"temperature": 1, "lr_scale": "0.25", "weight_version": 2.0})
    assert request == TrainRequest(1.0, 0.25, 2) and isinstance(request.weight_version, int)
