"""`ServerBackend`: what the trainer says to one kind of rollout server, as requests it can build without a server.

Four parts, each the protocol of the server's engine (vLLM's is `rollout/vllm_server.py:VLLMServerBackend`, the one
implementation; a rollout backend's registry entry names its instance, config/rollout_backends.py):
- launch: the argv a server actor runs (`launch_command`) and the engine flags the rollout node becomes
  (`engine_args`);
- generation: the request for one prompt's samples (`generate_request`, token ids in) and the samples read from the
  answer (`parse_samples`, token ids and sampled log-probs out); the sync check's scoring of a probe;
- pause / resume around a weight update;
- the weight-update protocol: open the transfer group, start an update, one request per bucket, finish with the
  policy version, and the info each link (gloo, ipc) puts in those requests.
`ServerClient` (server_client.py) sends what these build; `WeightSender` (resharding/transports/server.py) runs the
round pause → start → update per bucket → finish → resume through it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_like.rollout.kv_cache import KVCacheRequest


@dataclass(frozen=True)
class ServerRequest:
    """One HTTP call: `method route`, with a JSON body and query parameters when given."""

    method: str
    route: str
    json: Any = None
    params: Mapping[str, str] | None = None

    def send_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of httpx's `request(method, route, ...)` this request takes."""
        kwargs: dict[str, Any] = {}
        if self.json is not None:
            kwargs["json"] = self.json
        if self.params is not None:
            kwargs["params"] = dict(self.params)
        return kwargs


@dataclass(frozen=True)
class Completion:
    """One sample of a completion request: its token ids and their log-probs (after sampling processors);
    `weight_versions`: the `(version, start, end)` runs of tokens each weight version sampled, where the server
    says (our route on vLLM releases that label them), else None. `prompt_token_ids`: the prompt as the server
    expanded its image placeholders (image requests only: rollout/server_vision.py), else None."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str | None
    weight_versions: list[tuple[str, int, int]] | None = None
    prompt_token_ids: list[int] | None = None


class ServerBackend(abc.ABC):
    """The protocol of one kind of rollout server (module doc). Instances hold no state; clients share one."""

    label: str = "a rollout server"  # in messages: "vLLM"

    # ----- launch -----

    @abc.abstractmethod
    def launch_command(self, model_path: str, *, port: int, host: str, tensor_parallel_size: int, device: str,
                       extra_args: Sequence[str] = ()) -> list[str]:
        """The argv of one server process a server actor starts (workers/vllm_server_actor.py), `extra_args`
        (engine_args' flags) last."""

    @abc.abstractmethod
    def engine_args(self, rollout: Any, *, hf_overrides: Mapping[str, Any] | None = None,
                    trust_remote_code: bool = False, weight_transfer: str = "gloo", adapter_rank: int = 0,
                    adapter_window: int = 0, kv_cache: KVCacheRequest | None = None) -> list[str]:
        """Flags that build the engine the `actor_rollout_ref.rollout` node describes with the resolved
        `weight_transfer` link and the KV cache `kv_cache` asks for (rollout/kv_cache.py; None: the engine sizes
        it), then the node's server.extra_args, then (with `adapter_rank` > 0) the flags that serve adapters up
        to that rank, `adapter_window` of them loaded."""

    # ----- generation -----

    # The field of `generate_request`'s params saying how log-probs are made (SamplingConfig.log_probs_request).
    LOG_PROBS_FIELD = "log_probs"

    @abc.abstractmethod
    def generate_request(self, prompt_ids: Sequence[int], params: Mapping[str, Any], *, lean: bool,
                         model: str | None = None, adapter: str | None = None) -> ServerRequest:
        """The request for the `params["n"]` samples of one prompt (`SamplingConfig.vllm_fields`, plus
        LOG_PROBS_FIELD: how the sampled tokens' log-probs are made, "decode" when absent; a route that cannot
        skip or rescore them decodes them). lean: the server has verl_like's lean route (`lean_probe_request`);
        else the standard completion route naming `model`. adapter: the LoRA adapter the request names (None:
        base weights)."""

    @abc.abstractmethod
    def parse_samples(self, answer: Any, *, lean: bool) -> list[Completion]:
        """The samples of a `generate_request`'s answer, in sample order (ValueError when it is malformed)."""

    @abc.abstractmethod
    def score_request(self, token_ids: Sequence[int], model: str) -> ServerRequest:
        """The request for the served model's log-probs (temperature 1) of `token_ids`' own tokens (the sync
        check's probe, rollout/sync_check.py)."""

    @abc.abstractmethod
    def prompt_log_probs(self, answer: Any, token_ids: Sequence[int], start: int) -> list[float]:
        """The log-probs of tokens start.. of `token_ids` in a `score_request`'s answer (ValueError when it has
        none)."""

    @abc.abstractmethod
    def lean_probe_request(self) -> ServerRequest:
        """A request that a server with the lean route answers and one without answers 404."""

    @abc.abstractmethod
    def models_request(self) -> ServerRequest:
        """The request whose answer `served_model` reads."""

    @abc.abstractmethod
    def served_model(self, answer: Any) -> str:
        """The served model's name, which standard completion requests name."""

    # ----- pause / resume -----

    @abc.abstractmethod
    def pause_request(self, mode: str) -> ServerRequest:
        """Stops scheduling: "abort" ends in-flight requests, "keep" freezes them until resume."""

    @abc.abstractmethod
    def resume_request(self) -> ServerRequest:
        pass

    # ----- weight-update protocol -----

    @abc.abstractmethod
    def world_size_request(self) -> ServerRequest:
        """The request whose answer `world_size` reads."""

    @abc.abstractmethod
    def world_size(self, answer: Any) -> int:
        """The server's worker count: its ranks in a weight-transfer group."""

    @abc.abstractmethod
    def version_request(self) -> ServerRequest:
        """The request whose answer `server_version` reads: which request shapes its engine takes."""

    @abc.abstractmethod
    def server_version(self, answer: Any) -> str:
        pass

    @abc.abstractmethod
    def init_transfer_request(self, init_info: Mapping[str, Any]) -> ServerRequest:
        """Opens the server's side of the weight-transfer link (`gloo_init_info` / `ipc_init_info`)."""

    @abc.abstractmethod
    def start_update_request(self) -> ServerRequest:
        pass

    @abc.abstractmethod
    def is_abandoned_update(self, message: str) -> bool:
        """Whether a refused `start_update_request` says an earlier update was never finished (its sender died
        mid-round); the client then finishes that one and starts again."""

    @abc.abstractmethod
    def update_request(self, update_info: Mapping[str, Any]) -> ServerRequest:
        """One bucket of the update (`gloo_update_info` / `ipc_update_info`)."""

    @abc.abstractmethod
    def finish_update_request(self, version: int | None) -> ServerRequest:
        """Closes the update; the server labels what it samples from now on with policy `version` (None: an
        abandoned update closed without one)."""

    @abc.abstractmethod
    def reset_encoder_cache_request(self) -> ServerRequest:
        """Drops cached vision-encoder outputs (keyed by image, not weights) after an update of a vision model."""

    @abc.abstractmethod
    def gloo_init_info(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
                       timeout_s: float) -> dict[str, Any]:
        """`init_transfer_request`'s info for the gloo link: the group rank 0 hosts, this server's first rank."""

    @abc.abstractmethod
    def gloo_update_info(self, names: list[str], shapes: list[list[int]], dtype_name: str) -> dict[str, Any]:
        """`update_request`'s info for a gloo bucket: the tensors broadcast back to back as one flat `dtype_name`."""

    @abc.abstractmethod
    def gpu_uuid_request(self) -> ServerRequest:
        """The request whose answer `gpu_uuids` reads (the ipc link checks the server shares the sender's GPU)."""

    @abc.abstractmethod
    def gpu_uuids(self, answer: Any) -> list[str]:
        pass

    @abc.abstractmethod
    def ipc_init_info(self, server_version: str) -> dict[str, Any]:
        pass

    @abc.abstractmethod
    def ipc_update_info(self, server_version: str, names: list[str], dtype_names: list[str],
                        shapes: list[list[int]], tensor_sizes: list[int], handles: dict[str, tuple]) -> dict[str, Any]:
        """`update_request`'s info for an ipc bucket: one buffer on the sender's GPU, `handles` {GPU UUID: the
        buffer's reduce_tensor args}."""
