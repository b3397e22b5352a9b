"""HTTP client of one vLLM server: health, generation (token ids in and out), pause/resume, weight transfer.

Every call has a timeout and checks the status; a failure raises `ServerError` naming the server and the route.
Request shapes that differ between vLLM releases come from `vllm_compat` (this module imports no vLLM).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from verl_like.rollout.server_generate import ROUTE as GENERATE_ROUTE
from verl_like.rollout.server_generate import decode_array

logger = logging.getLogger(__name__)
# httpx logs every request at INFO: thousands of lines per rollout.
logging.getLogger("httpx").setLevel(logging.WARNING)


class ServerError(RuntimeError):
    """A vLLM server did not answer, or answered with an error; the message names the server and the route."""


@dataclass(frozen=True)
class Completion:
    """One sample of a completion request: its token ids and their log-probs (after sampling processors)."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str | None


class ServerClient:
    """Talks to the vLLM server at `address` ("http://host:port"); `name` labels it in errors ("server 0")."""

    def __init__(self, address: str, name: str, timeout_s: float = 600.0, connect_timeout_s: float = 10.0) -> None:
        self.address = address.rstrip("/")
        self.name = name
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.address,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self._model: str | None = None
        self._lean: bool | None = None

    def __repr__(self) -> str:
        return f"{self.name} ({self.address})"

    # ----- plumbing -----

    def request(self, method: str, route: str, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """The JSON answer of `method route`; raises ServerError on a transport error, a timeout or a non-2xx."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        try:
            response = self._http.request(method, route, timeout=timeout, **kwargs)
        except httpx.TimeoutException as err:
            limit = timeout_s if timeout_s is not None else self.timeout_s
            raise ServerError(f"{self}: {method} {route} timed out after {limit:.0f} s ({type(err).__name__})") from err
        except httpx.HTTPError as err:
            raise ServerError(f"{self}: {method} {route} failed: {type(err).__name__}: {err}") from err
        if response.status_code >= 300:
            raise ServerError(f"{self}: {method} {route} answered HTTP {response.status_code}: {response.text[:500]}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def healthy(self) -> bool:
        """True when GET /health answers 200 within a few seconds."""
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float, alive: Any = None) -> float:
        """Polls /health until it answers; `alive()` (when given) False aborts early. Returns the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.healthy():
                return time.monotonic() - start
            if alive is not None and not alive():
                raise ServerError(f"{self}: the server process exited before it answered /health")
            time.sleep(1.0)
        raise ServerError(
            f"{self}: no answer on /health after {timeout_s:.0f} s; raise "
            "actor_rollout_ref.rollout.server.start_timeout_s if the machine is slow"
        )

    @property
    def model(self) -> str:
        """The served model name (what completion requests must name)."""
        if self._model is None:
            self._model = self.request("GET", "/v1/models")["data"][0]["id"]
        return self._model

    def version(self) -> str:
        """The server's vLLM version ("0.25.1"): which request shapes its weight-transfer engine takes."""
        return str(self.request("GET", "/version")["version"])

    def world_size(self) -> int:
        """The server's TP × PP × DP worker count (its ranks in a weight-transfer group)."""
        return int(self.request("GET", "/get_world_size")["world_size"])

    # ----- generation -----

    @property
    def lean(self) -> bool:
        """Whether the server has verl_like's lean generation route (servers started by `verl_like.serve` do;
        a plain `vllm serve` answers 404 and gets OpenAI completion requests)."""
        if self._lean is None:
            try:
                self._lean = self._http.get(GENERATE_ROUTE, timeout=10.0).status_code == 200
            except httpx.HTTPError as err:
                raise ServerError(f"{self}: GET {GENERATE_ROUTE} failed: {type(err).__name__}: {err}") from err
            if not self._lean:
                logger.info("%s has no %s route: generating through /v1/completions", self, GENERATE_ROUTE)
        return self._lean

    def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> list[Completion]:
        """The `params["n"]` samples of one prompt, in sample order (token ids in, token ids out)."""
        if self.lean:
            answer = self.request("POST", GENERATE_ROUTE, json={"prompt_token_ids": prompt_ids, "params": params})
            return [
                Completion(decode_array(sample["token_ids"], "<i4").tolist(),
                           decode_array(sample["log_probs"], "<f4").tolist(), sample["finish_reason"])
                for sample in answer["samples"]
            ]
        # return_tokens_as_token_ids: the server writes "token_id:N" for each log-prob entry instead of decoding
        # every generated token once more (we read only token_ids and token_logprobs).
        body = {"model": self.model, "prompt": prompt_ids, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False, **params}
        answer = self.request("POST", "/v1/completions", json=body)
        choices = sorted(answer["choices"], key=lambda choice: choice["index"])
        out = []
        for choice in choices:
            tokens = [int(token) for token in choice["token_ids"]]
            log_probs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
            if len(log_probs) != len(tokens):
                raise ServerError(f"{self}: {len(log_probs)} log-probs for {len(tokens)} tokens in a completion")
            out.append(Completion(tokens, log_probs, choice.get("finish_reason")))
        return out

    def pause(self, mode: str = "abort") -> None:
        """Stops scheduling: "abort" ends in-flight requests, "keep" freezes them until `resume`."""
        self.request("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        self.request("POST", "/resume")

    def reset_prefix_cache(self) -> None:
        self.request("POST", "/reset_prefix_cache")

    # ----- weight transfer (vLLM's native API) -----

    def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None:
        self.request("POST", "/init_weight_transfer_engine", json={"init_info": init_info}, timeout_s=timeout_s)

    def start_weight_update(self) -> None:
        self.request("POST", "/start_weight_update")

    def update_weights(self, update_info: dict[str, Any], timeout_s: float) -> None:
        self.request("POST", "/update_weights", json={"update_info": update_info}, timeout_s=timeout_s)

    def finish_weight_update(self, body: dict[str, Any]) -> None:
        self.request("POST", "/finish_weight_update", json=body)

    def shutdown_weight_transfer(self) -> None:
        self.request("POST", "/shutdown_weight_transfer_engine")

    def close(self) -> None:
        self._http.close()
