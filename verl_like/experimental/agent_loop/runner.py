"""`AgentLoopRunner`: runs one agent loop per sample, each its own asyncio task, and builds the rollout batch.

The process that owns the engine runs it: each colocated worker for its chunk (with the in-process engine), or
the driver in server mode (with the servers). Every sample gets its own `_SampleSession` as its
`server_manager`: it seeds each turn (a resumed run samples what the uninterrupted one did), bounds each turn by
what is left of the response budget, and records the weight version of each turn: the version that sampled its
last token (the engine's per-token labels where it gives them, else the generator's version when the turn came
back). With partial rollout a turn in flight at a weight update is frozen and finished by the new weights; it is
counted in `turns_across_update` (two labelled runs of tokens, or the version changed while it ran). Each of its
tokens keeps the log-prob of the weights that sampled it, which is what rollout importance sampling reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from verl_like.experimental.agent_loop import agent_loop as api
from verl_like.experimental.agent_loop.vision_turns import ImageTurns, loop_image_data
from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.batch import prompt_token_lists
from verl_like.rollout.token_generate import TokenGenerator, TokenOutput
from verl_like.rollout.trajectory import LossMaskReason, Trajectory, build_trajectory_batch, trajectory_metrics
from verl_like.utils.rollout_trace import trace_stats

logger = logging.getLogger(__name__)

_TURN_SEED_STRIDE = 1_000_003


class _SampleSession:
    """The `server_manager` of one sample (see the module doc)."""

    def __init__(self, generator: TokenGenerator, session_id: str, seed: int | None, response_length: int,
                 defaults: dict[str, Any], images: ImageTurns | None = None) -> None:
        self.generator = generator
        self.images = images  # an image sample's turns (vision_turns.py)
        self.session_id = session_id
        self.seed = seed
        self.response_length = response_length
        self.defaults = defaults
        self.first_prompt_len: int | None = None
        self.versions: list[int] = []
        self.turns_across_update = 0

    async def generate(self, request_id: str | None = None, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None) -> TokenOutput:
        if self.first_prompt_len is None:
            self.first_prompt_len = len(prompt_ids)
        remaining = self.response_length - (len(prompt_ids) - self.first_prompt_len)
        if remaining < 1:
            return TokenOutput([], [], "length")
        params = {**self.defaults, **{k: v for k, v in sampling_params.items() if v is not None}}
        params.pop("logprobs", None)
        params["max_tokens"] = min(int(params.get("max_tokens", remaining)), remaining)
        if self.seed is not None:
            params["seed"] = self.seed + len(self.versions) * _TURN_SEED_STRIDE
        before = int(getattr(self.generator, "version", 0))
        if image_data:
            out = await self._image_turn(prompt_ids, params, list(image_data), video_data)
        else:
            out = await self.generator.generate(self.session_id, prompt_ids=prompt_ids, sampling_params=params,
                                                image_data=image_data, video_data=video_data)
        after = int(getattr(self.generator, "version", 0))
        version, across = turn_version(out.weight_versions, before, after)
        self.versions.append(version)
        self.turns_across_update += int(across)
        return out


    async def _image_turn(self, prompt_ids: list[int], params: dict[str, Any], images: list[Any],
                          video_data: Any) -> TokenOutput:
        """One turn with images: sent with one placeholder per image, the engine's expansion checked (a prompt
        sent unexpanded: its expansion learnt, and the response budget counted from it)."""
        if self.images is None:
            raise ValueError(f"sample {self.session_id}: image_data given but the sample has no images in the "
                             "dataset (rows' multi_modal_data), which the trainer's pixel_values come from")
        sent, new = self.images.engine_ids(prompt_ids, images)
        out = await self.generator.generate(self.session_id, prompt_ids=sent, sampling_params=params,
                                            image_data=images, video_data=video_data)
        self.images.check(prompt_ids, sent, out.prompt_ids, new)
        if new and len(self.versions) == 0:
            self.first_prompt_len = len(out.prompt_ids)
        return out


def turn_version(spans: list[tuple[str, int, int]] | None, before: int, after: int) -> tuple[int, bool]:
    """(the version that sampled a turn's last token, whether a weight update came while the turn ran) from the
    engine's labelled runs of tokens `(version, start, end)` (tokens before the first run had no label: an update
    came later), else from the generator's version before and after the turn."""
    if not spans:
        return after, after != before
    label = spans[-1][0]
    version = int(label) if label.lstrip("-").isdigit() else after
    return version, len(spans) > 1 or spans[0][1] > 0


def sampling_params_of(sampling: SamplingConfig) -> dict[str, Any]:
    """verl's sampling_params dict of a SamplingConfig (what `AgentLoopBase.run` receives)."""
    return {
        "temperature": sampling.temperature if sampling.do_sample else 0.0,
        "top_p": sampling.top_p if sampling.do_sample else 1.0,
        "top_k": (sampling.top_k or -1) if sampling.do_sample else -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
    }


def to_trajectory(output: api.AgentLoopOutput, name: str) -> Trajectory:
    """The ledger of a loop's output: ours carry it whole; another loop's response_mask zeros are TOOL unless
    `extra_fields["loss_mask_reason"]` gives each token's reason."""
    ledger = output.extra_fields.get("trajectory")
    if isinstance(ledger, Trajectory):
        trajectory = ledger
    else:
        r = len(output.response_ids)
        if len(output.response_mask) != r or (output.response_logprobs is not None
                                               and len(output.response_logprobs) != r):
            raise ValueError(f"agent loop {name!r}: {r} response_ids but {len(output.response_mask)} response_mask "
                             f"entries and {len(output.response_logprobs or [])} response_logprobs")
        reasons = output.extra_fields.get("loss_mask_reason")
        mask_reason = [int(LossMaskReason.TRAINED) if m else int(reasons[i] if reasons else LossMaskReason.TOOL)
                       for i, m in enumerate(output.response_mask)]
        trajectory = Trajectory(list(output.prompt_ids), list(output.response_ids), mask_reason,
                                list(output.response_logprobs or [0.0] * r), num_turns=output.num_turns)
        for key in ("tool_calls", "tool_errors", "malformed_calls"):
            setattr(trajectory, key, int(output.extra_fields.get(key, 0)))
        trajectory.extra["no_log_probs"] = output.response_logprobs is None
    trajectory.reward_score = output.reward_score if output.reward_score is not None else trajectory.reward_score
    return trajectory


class AgentLoopRunner:
    """Runs a batch through agent loops. `config` is the run's config with verl's key names (a DictConfig, see
    `agent_config_view`); `registry` adds loop names registered elsewhere (the driver's)."""

    def __init__(self, config: Any, tokenizer: Any, processor: Any = None,
                 registry: dict[str, dict[str, Any]] | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.processor = processor
        for name, entry in (registry or {}).items():
            api._agent_loop_registry.setdefault(name, dict(entry))
        agent = config.actor_rollout_ref.rollout.agent
        if agent.agent_loop_config_path:
            api.load_agent_loop_config(agent.agent_loop_config_path)
        self.default_agent = agent.default_agent_loop
        rollout = config.actor_rollout_ref.rollout
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)

    def _image_token_id(self, row: dict[str, Any]) -> int | None:
        """The image placeholder's id for a row with images (the processor's, else Idefics3's `<image>`)."""
        if loop_image_data(row) is None:
            return None
        return int(self.tokenizer.convert_tokens_to_ids(getattr(self.processor, "image_token", "<image>")))

    async def _run_one(self, name: str, session: _SampleSession, sampling_params: dict[str, Any],
                       kwargs: dict[str, Any]) -> Trajectory:
        cls, extra = api.agent_loop_class(name)
        loop = cls(trainer_config=api.DictConfigWrap(self.config), server_manager=session, tokenizer=self.tokenizer,
                   processor=self.processor, dataset_cls=None, dataset_config=api.DictConfigWrap(self.config.data),
                   **extra)
        output = await loop.run(dict(sampling_params), **kwargs)
        trajectory = to_trajectory(output, name)
        trajectory.turn_versions = list(session.versions)
        trajectory.turns_across_update = session.turns_across_update
        return trajectory

    async def run(self, prompts: DataProto, sampling: SamplingConfig, generator: TokenGenerator,
                  pad_token_id: int) -> DataProto:
        """The rollout batch of `prompts` (rows i*n .. i*n+n-1 from prompt i; layout in rollout/trajectory.py)."""
        start = time.perf_counter()
        token_lists = prompt_token_lists(prompts)
        columns = prompts.non_tensor_batch
        names = columns.get("agent_name")
        base = sampling_params_of(sampling)
        defaults = {"ignore_eos": sampling.ignore_eos, "stop_token_ids": list(sampling.stop_token_ids)}
        tasks, kinds = [], []
        for i, tokens in enumerate(token_lists):
            row = {key: value[i] for key, value in columns.items() if key != "agent_name"}
            extra_info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
            row.setdefault("tools_kwargs", extra_info.get("tools_kwargs", {}))
            row["prompt_ids"] = list(tokens)
            name = str(names[i]) if names is not None and names[i] else self.default_agent
            for j in range(sampling.n):
                seed = None if sampling.seed is None else sampling.seed + i * sampling.n + j
                sample = f"{id(prompts)}-{i}-{j}"
                images = ImageTurns.of_row(row, self._image_token_id(row), f"rollout row {i} sample {j}")
                session = _SampleSession(generator, sample, seed, self.response_length, defaults, images)
                tasks.append(asyncio.ensure_future(self._run_one(name, session, base, dict(row))))
                kinds.append((name, tokens))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        trajectories, failures = [], []
        for (name, tokens), result in zip(kinds, results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                failures.append(f"agent loop {name!r} raised {type(result).__name__}: {result}")
                result = Trajectory(list(tokens), infra_failure=failures[-1])
            trajectories.append(result)
        if failures and len(failures) == len(trajectories):
            raise RuntimeError(f"every sample of the rollout failed; the first: {failures[0]}")
        if failures:
            logger.warning("%d of %d agent loops raised (infrastructure failures, left out of the loss); first: %s",
                           len(failures), len(trajectories), failures[0])
        for trajectory in trajectories:
            trajectory.cut(self.response_length)  # before the metrics: they count what the batch holds
        metrics = self._metrics(trajectories, time.perf_counter() - start)
        out = build_trajectory_batch(prompts, trajectories, sampling.n, self.prompt_length, self.response_length,
                                     pad_token_id, metrics)
        if any(t.extra.get("no_log_probs") for t in trajectories):
            out.batch.pop("rollout_log_probs")  # a loop returned none: no rollout IS or log-prob gap for this batch
        return out

    def run_sync(self, prompts: DataProto, sampling: SamplingConfig, generator: TokenGenerator,
                 pad_token_id: int) -> DataProto:
        """`run` from synchronous code (a worker method or the driver), in a fresh event loop."""
        return asyncio.run(self.run(prompts, sampling, generator, pad_token_id))

    @staticmethod
    def _metrics(trajectories: list[Trajectory], seconds: float) -> dict[str, float]:
        metrics = trajectory_metrics(trajectories)
        latencies = [s for t in trajectories for s in t.extra.get("tool_latency_s", [])]
        if latencies:
            metrics["agent/tool_latency_s/mean"] = sum(latencies) / len(latencies)
            metrics["agent/tool_latency_s/max"] = max(latencies)
        sampled = sum(sum(t.loss_mask) for t in trajectories)
        metrics["rollout/generated_tokens"] = float(sum(int(r == 0) for t in trajectories for r in t.mask_reason))
        metrics["rollout/mean_response_length"] = sampled / max(len(trajectories), 1)
        metrics["agent/rollout_s"] = seconds
        for name, (calls, total) in trace_stats().items():
            metrics[f"agent/trace/{name}/calls"] = float(calls)
            metrics[f"agent/trace/{name}/s"] = total
        return metrics


def agent_config_dict(config: Any) -> dict[str, Any]:
    """The whole config as plain containers with verl's key names (`data.tool_config_path` mirrors
    multi_turn.tool_config_path, as in verl's schema): what agent loops read as `self.config`."""
    from collections.abc import Mapping
    from dataclasses import asdict, is_dataclass

    def containers(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): containers(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [containers(v) for v in value]
        return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)

    plain = containers(asdict(config) if is_dataclass(config) else dict(config))
    plain.setdefault("data", {})["tool_config_path"] = (
        plain["actor_rollout_ref"]["rollout"]["multi_turn"]["tool_config_path"])
    return plain


def agent_config_view(config: Any) -> Any:
    """`agent_config_dict` as the OmegaConf DictConfig verl's loops expect."""
    from omegaconf import OmegaConf

    return OmegaConf.create(agent_config_dict(config))


def registry_snapshot() -> dict[str, dict[str, Any]]:
    """The loops registered in this process (to hand to the processes that run them)."""
    return {name: dict(entry) for name, entry in api._agent_loop_registry.items()}
