"""`GenerationRequest`: what one rollout call asks for, read once from the prompts' meta_info.

The driver writes it into `prompts.meta_info` (the keys a user's worker has always read: "validate", "do_sample",
"seed"); the colocated worker and the server-mode handle parse it back with `from_meta_info` and turn it into a
`SamplingConfig` with `sampling`, so no layer below them handles the string keys.

    prompts.meta_info.update(GenerationRequest(seed=1234).to_meta_info())
    sampling = GenerationRequest.from_meta_info(prompts.meta_info).sampling(rollout_config)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verl_like.config.rollout import RolloutConfig
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.from_config import sampling_config


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One rollout call's settings beyond the rollout node.

    validate: sample as rollout.val_kwargs say (meta_info "validate": True).
    greedy: argmax decoding, one sample per prompt (meta_info "do_sample": False; e.g. ReMax's baseline).
    seed: seeds this call's sampling, so a resumed run samples what the uninterrupted one did: prompt i of the
      whole batch draws from seed + i * n (meta_info "seed"); None leaves the engine's own stream.
    """

    validate: bool = False
    greedy: bool = False
    seed: int | None = None

    @classmethod
    def from_meta_info(cls, meta_info: Mapping[str, Any]) -> GenerationRequest:
        """The request a prompts batch carries (absent keys: a plain training rollout)."""
        seed = meta_info.get("seed")
        return cls(
            validate=bool(meta_info.get("validate", False)),
            greedy=meta_info.get("do_sample", True) is False,
            seed=None if seed is None else int(seed),
        )

    def to_meta_info(self) -> dict[str, Any]:
        """The meta_info keys of this request; defaults are left out, so a plain rollout adds none."""
        meta: dict[str, Any] = {}
        if self.validate:
            meta["validate"] = True
        if self.greedy:
            meta["do_sample"] = False
        if self.seed is not None:
            meta["seed"] = self.seed
        return meta

    def sampling(self, rollout: RolloutConfig, prompts_before: int = 0) -> SamplingConfig:
        """The SamplingConfig of this request; `prompts_before`: prompts of the whole batch ahead of this chunk
        (their samples take the seeds before this chunk's)."""
        sampling = sampling_config(rollout, validate=self.validate, greedy=self.greedy)
        if self.seed is not None and sampling.do_sample:
            sampling = dataclasses.replace(sampling, seed=self.seed + prompts_before * sampling.n)
        return sampling
