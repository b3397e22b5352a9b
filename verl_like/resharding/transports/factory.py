"""`build_colocated_transport`: the one place that picks how an in-process rollout engine gets the weights."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from verl_like.config.rollout import RolloutConfig
from verl_like.engine.base import TrainEngine
from verl_like.resharding.transports.base import WeightTransport
from verl_like.resharding.transports.full import FullTensorTransport
from verl_like.rollout.base import RolloutEngine
from verl_like.shapes.decoder import DecoderShape, UnknownLayoutError

logger = logging.getLogger(__name__)


def build_colocated_transport(
    engine: TrainEngine,
    rollout: RolloutEngine | None,
    config: RolloutConfig,
    hf_config: Callable[[], Any],
    hook: Callable[[Iterable[tuple[str, torch.Tensor]]], None] | None = None,
) -> WeightTransport | None:
    """The transport from `engine` into this rank's `rollout`, in this order:
    - `hook` (a user's update_rollout_weights): full tensors into it (a LoRA policy's merged);
    - no engine (a text hook without a weight hook): None;
    - a LoRA engine and an engine serving adapters: adapter-only (AdapterTransport);
    - a LoRA engine otherwise (lora.merge=true): merged full tensors (the slice plan speaks plain HF names only);
    - sliced when the engine loads TP slices and the layout (`hf_config()`) is known; else full tensors.
    """
    if hook is not None:
        return FullTensorTransport(engine, hook, mode="hook")
    if rollout is None:
        return None
    if engine.lora_enabled:
        if rollout.supports_adapters:
            from verl_like.resharding.transports.adapter import AdapterTransport

            return AdapterTransport(engine, rollout)
        return FullTensorTransport(engine, rollout.load_weights, mode="merged")
    if config.weight_sync_mode == "sliced" and rollout.supports_slice_loading:
        from verl_like.resharding.transports.colocated_sliced import SlicedTransport

        try:
            shape = DecoderShape.from_hf_config(hf_config())
            return SlicedTransport(engine, rollout, shape, config.bucket_bytes, config.weight_sync_timeout_s)
        except UnknownLayoutError as err:
            logger.warning("sliced weight sync unavailable (%s); syncing full tensors through vLLM's loader", err)
    # A frozen vision tower goes to vLLM once, unless the engine's sleep throws its weights away.
    return FullTensorTransport(engine, rollout.load_weights, send_static_once=not rollout.sleep_discards_weights)
