"""Qwen2-VL / Qwen2.5-VL through the engine: M-RoPE positions made once per prompt, pixels by row, padded and
micro-batched, on one process and on 2 FSDP ranks, equal a float64 single-row HF forward (the model computing its
own positions); a row whose placeholders do not match its image features is refused naming it.

Synthetic patches and grids (qwen_vl_rows.py): transformers' Qwen2-VL image processor imports torchvision, which
does not load on the CPU machines.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from transformers import AutoTokenizer

from engine_reference import policy_loss
from qwen_vl_rows import PROMPT_LEN, TEMPERATURE, image_rows, reference_log_probs
from verl_like.data.mrope import MRopeIndex
from verl_like.engine.config import EngineConfig
from verl_like.engine.model_loading import load_model
from verl_like.engine.model_outputs import micro_batch_outputs
from verl_like.engine.vision import image_feature_check
from verl_like.models.tiny_qwen_vl import TinyQwenVLSpec, build_tiny_qwen_vl
from verl_like.protocol import DataProto

MODEL_TYPES = ["qwen2_vl", "qwen2_5_vl"]


@pytest.fixture(scope="module", params=MODEL_TYPES)
def qwen_vl(request, tmp_path_factory):
    """(model dir, fp32 model as the engine loads it, the batch) of one family."""
    path = build_tiny_qwen_vl(tmp_path_factory.mktemp("qwen_vl") / request.param,
                              TinyQwenVLSpec(model_type=request.param))
    model = load_model(EngineConfig(model_path=str(path)))
    batch = image_rows(model.config, AutoTokenizer.from_pretrained(path))
    return str(path), model, batch


def test_padded_micro_batches_match_the_float64_single_row_reference(qwen_vl):
    _, model, batch = qwen_vl
    assert type(model).__name__ in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
    tensors = TensorDict(batch, batch_size=[len(batch["input_ids"])])
    with torch.no_grad():
        reference = reference_log_probs(model.double(), batch)
        model.float()
        pieces = [micro_batch_outputs(model, "causal_lm", tensors[rows], packed=False, temperature=TEMPERATURE)
                  for rows in (slice(0, 2), slice(2, 5), slice(5, 6))]
    log_probs = torch.cat([piece["log_probs"] for piece in pieces])
    assert int(batch["response_mask"].sum()) > 15
    torch.testing.assert_close(log_probs, reference.float(), atol=1e-5, rtol=1e-5)


def test_positions_made_for_the_prompt_and_continued_equal_hfs_over_the_whole_sequence(qwen_vl):
    _, model, batch = qwen_vl
    index = MRopeIndex(model.config)
    whole = index.prompt_positions(batch["input_ids"], batch["attention_mask"], batch["image_grid_thw"])
    valid = batch["attention_mask"].bool().unsqueeze(1).expand(-1, 3, -1)
    assert torch.equal(batch["mrope_position_ids"][valid], whole[valid])
    # The images really moved the text positions: the last prompt token sits below its column index.
    assert int(batch["mrope_position_ids"][4, 0, PROMPT_LEN - 1]) < int(batch["position_ids"][4, PROMPT_LEN - 1])


def test_a_row_whose_placeholders_do_not_match_its_image_features_is_refused_naming_it(qwen_vl):
    _, model, batch = qwen_vl
    grids = batch["image_grid_thw"].clone()
    grids[3, 1] = 0  # row 3 keeps the placeholders of two images but the grid of one
    check = image_feature_check(model.config)
    check(TensorDict(batch, batch_size=[6]))  # the good batch passes
    with pytest.raises(ValueError, match=r"row 3 of this rank's batch holds 8 image placeholder tokens but its "
                                         r"image_grid_thw \[\[1, 4, 4\], \[0, 0, 0\]\] gives 4 image features"):
        check(TensorDict({**batch, "image_grid_thw": grids}, batch_size=[6]))


def test_two_fsdp_ranks_match_the_reference_and_a_mismatch_on_one_rank_fails_both(qwen_vl, tmp_path):
    from qwen_vl_scenarios import run_two_ranks

    path, model, batch = qwen_vl
    results = run_two_ranks(path, batch, str(tmp_path))
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}:\n{result.get('error')}"
    with torch.no_grad():
        reference = reference_log_probs(model.double(), batch)
        model.float()
    log_probs = torch.cat([result["log_probs"] for result in results])
    torch.testing.assert_close(log_probs, reference.float(), atol=1e-5, rtol=1e-5)
    outputs = {"log_probs": reference}
    full = DataProto.from_dict(tensors={key: batch[key].double() if key == "advantages" else batch[key]
                                        for key in ("response_mask", "advantages")},
                               meta_info={"global_token_count": int(batch["response_mask"].sum())})
    expected_loss, _ = policy_loss(outputs, full)
    assert sum(result["loss"] for result in results) / 2 == pytest.approx(float(expected_loss), rel=1e-5)
    assert [result["num_micro_batches"] for result in results] == [2, 2]
    assert "row 0 of this rank's batch holds 8 image placeholder tokens" in results[1]["mismatch"]
    assert "another data-parallel rank could not plan" in results[0]["mismatch"]
