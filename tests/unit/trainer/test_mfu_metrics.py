"""perf/mfu/*: the step's update FLOPs (utils/flops.py) over the phase time, the world size and the peak."""

import pytest
import torch

from verl_like.protocol import DataProto
from verl_like.trainer.metrics import mfu_metrics
from verl_like.shapes.decoder import DecoderShape
from verl_like.utils.flops import training_flops

SHAPE = DecoderShape(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     intermediate_size=16, vocab_size=10)


def _batch() -> DataProto:
    attention_mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    return DataProto.from_dict(tensors={"attention_mask": attention_mask, "response_mask": attention_mask[:, 3:]})


def test_actor_and_critic_mfu_use_their_heads_epochs_and_times():
    batch = _batch()
    lengths = torch.tensor([3, 5])
    timings = {"update_actor": 2.0, "update_critic": 0.5}
    metrics = mfu_metrics(batch, timings, world_size=2, peak_tflops=1e-9,
                          actor=(SHAPE, 2), critic=(SHAPE, 1))
    actor_flops = 2 * training_flops(SHAPE, lengths, head_tokens=3, head_width=10)
    critic_flops = training_flops(SHAPE, lengths, head_tokens=8, head_width=1)
    assert metrics["perf/mfu/actor"] == pytest.approx(actor_flops / (2.0 * 2 * 1e3))
    assert metrics["perf/mfu/critic"] == pytest.approx(critic_flops / (0.5 * 2 * 1e3))


def test_no_peak_or_no_update_means_no_mfu():
    batch = _batch()
    assert mfu_metrics(batch, {"update_actor": 1.0}, 2, None, (SHAPE, 1), None) == {}
    assert mfu_metrics(batch, {}, 2, 1.0, (SHAPE, 1), (SHAPE, 1)) == {}  # critic warm-up: no actor update timed
    assert set(mfu_metrics(batch, {"update_actor": 1.0}, 2, 1.0, (SHAPE, 1), None)) == {"perf/mfu/actor"}
