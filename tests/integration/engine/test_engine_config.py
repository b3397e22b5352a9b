"""EngineConfig validation and the LR schedule, without processes or models."""

import math

import pytest

from verl_like.engine.config import EngineConfig
from verl_like.engine.lr_schedule import WarmupSchedule


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_path": ""}, "model_path is empty"),
        ({"model_kind": "critic"}, "model_kind='critic'"),
        ({"dtype": "float16"}, "dtype='float16'"),
        ({"param_dtype": "fp8"}, "param_dtype='fp8'"),
        ({"attn_implementation": "flash"}, "attn_implementation='flash'"),
        ({"lr": -1.0}, "lr=-1.0"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"lr_scheduler": "linear"}, "lr_scheduler='linear'"),
        ({"warmup_steps": -1}, "warmup_steps=-1"),
        ({"lr_scheduler": "cosine"}, "needs total_steps > warmup_steps"),
        ({"lr_scheduler": "cosine", "warmup_steps": 5, "total_steps": 5}, "total_steps=5"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio=1.5"),
        ({"grad_clip": 0.0}, "grad_clip=0.0"),
        ({"micro_batch_size_per_rank": 0}, "micro_batch_size_per_rank=0"),
        ({"use_dynamic_bsz": True}, "max_tokens_per_rank >= 1"),
    ],
)
def test_invalid_settings_are_rejected_with_the_field_name(overrides, message):
    settings = {"model_path": "/models/tiny", **overrides}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig(**settings)


def test_config_is_frozen():
    config = EngineConfig(model_path="/models/tiny")
    with pytest.raises(AttributeError):
        config.lr = 1.0  # type: ignore[misc]


def test_constant_schedule_warms_up_linearly_then_stays():
    schedule = WarmupSchedule("constant", warmup_steps=4)
    assert [schedule(step) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert WarmupSchedule("constant", warmup_steps=0)(0) == 1.0


def test_cosine_schedule_matches_the_formula_and_stays_at_the_floor():
    schedule = WarmupSchedule("cosine", warmup_steps=0, total_steps=10, min_lr_ratio=0.2)
    for step in range(10):
        expected = 0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * step / 10))
        assert schedule(step) == pytest.approx(expected, rel=1e-12)
    assert schedule(10) == pytest.approx(0.2) and schedule(25) == pytest.approx(0.2)
