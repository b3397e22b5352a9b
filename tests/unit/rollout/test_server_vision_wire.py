"""The wire of image requests to our servers (rollout/server_vision.py), without a server."""

import types

import numpy as np
import pytest
from PIL import Image

from verl_like.rollout.server_client import ServerError
from verl_like.rollout.server_generate import encode_array
from verl_like.rollout.server_vision import (ServerImages, allowed_token_ids, check_placeholders, decode_image,
                                             encode_image, parse_body, refuse_plain_server, request_body)


def picture(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (12, 10, 3), dtype=np.uint8))


def test_an_image_crosses_the_wire_with_its_pixels_unchanged():
    image = picture()
    back = decode_image(encode_image(image))
    assert back.size == image.size and np.array_equal(np.asarray(back), np.asarray(image))


def test_a_request_body_carries_the_unexpanded_ids_one_image_each_and_the_params():
    body = request_body([5, 9, 7], [picture(1), picture(2)], {"n": 4, "max_tokens": 3})
    prompt, images, params = parse_body(body)
    assert prompt == [5, 9, 7] and params == {"n": 4, "max_tokens": 3}
    assert [np.asarray(i).tolist() for i in images] == [np.asarray(picture(s)).tolist() for s in (1, 2)]
    with pytest.raises(ValueError, match="at least one image"):
        parse_body({**body, "images": []})


def test_the_server_takes_one_unexpanded_placeholder_per_image():
    check_placeholders([1, 4, 2, 4], 2, image_token_id=4)
    with pytest.raises(ValueError, match="holds 3 image placeholder.*for 1 image"):
        check_placeholders([1, 4, 4, 4, 2], 1, image_token_id=4)  # already expanded


def test_the_sampled_vocabulary_leaves_out_the_image_placeholder_only():
    config = types.SimpleNamespace(model="m", is_multimodal_model=True, get_vocab_size=lambda: 6,
                                   hf_config=types.SimpleNamespace(image_token_id=4))
    assert allowed_token_ids(config) == [0, 1, 2, 3, 5]
    text = types.SimpleNamespace(model="t", is_multimodal_model=False, get_vocab_size=lambda: 6,
                                 hf_config=types.SimpleNamespace())
    with pytest.raises(ValueError, match="takes no images"):
        allowed_token_ids(text)


class FakeClient:
    """A client whose server answers `answer` on the image route (or has no lean route at all)."""

    def __init__(self, lean: bool, answer: dict | None = None) -> None:
        self.lean, self.answer, self.address, self.posts = lean, answer, "http://fake", 0

    def __str__(self) -> str:
        return "server 0 (http://fake)"

    def request(self, method, route, **kwargs):
        if method == "POST":
            self.posts += 1
            return self.answer
        return {"version": 1}


def test_a_plain_vllm_serve_is_refused_without_a_retry():
    with pytest.raises(ServerError, match="plain `vllm serve`") as err:
        refuse_plain_server(FakeClient(lean=False))
    assert err.value.status == 400  # ServerPool does not retry a 4xx


def test_the_answer_gives_the_expanded_prompt_to_each_sample_and_a_wrong_one_names_the_row():
    sample = {"token_ids": encode_array([3, 2], "<i4"), "log_probs": encode_array([-0.5, -1.0], "<f4"),
              "finish_reason": "length", "weight_versions": None}
    client = FakeClient(True, {"prompt_token_ids": encode_array([1, 4, 4, 4, 2], "<i4"), "samples": [sample] * 2})
    images = ServerImages()
    body = request_body([1, 4, 2], [picture()], {"n": 2})
    samples = images.send(client, body, [1, 4, 4, 4, 2], "rollout row 3")
    assert [s.prompt_token_ids for s in samples] == [[1, 4, 4, 4, 2]] * 2 and samples[0].token_ids == [3, 2]
    assert images.images_sent == 1
    with pytest.raises(ValueError, match="rollout row 3: the server expanded the image prompt to 5 tokens"):
        images.send(client, body, [1, 4, 4, 2], "rollout row 3")
