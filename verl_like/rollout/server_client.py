"""HTTP client of one rollout server: health, generation (token ids in and out), pause/resume, weight transfer.

Every call has a timeout and checks the status; a failure raises `ServerError` naming the server and the route.
What each call sends and how its answer reads is the server's `ServerBackend` (server_backend.py; vLLM's by
default, rollout/vllm_server.py, whose request shapes per vLLM release come from `vllm_compat`); this module sends
and imports no vLLM.

Each thread talks through an `httpx.Client` of its own: no connection is ever shared between threads. One client
shared by the rollout's thread pool hung a run and then failed with `ReadError: [Errno 9] Bad file descriptor`
(issue #32): httpcore's pool closes idle connections (keep-alive expired, closed by the server, or above
`max_keepalive_connections`, a count that is really the pool's total) from whichever thread next enters it, with
no lock against the thread that was just handed the same connection, which then reads a socket closed under it
(or, through a reused descriptor number, waits on an unrelated file until its read timeout). Idle connections are
dropped after `KEEPALIVE_S`, before the server's own keep-alive (vLLM's uvicorn closes them after
VLLM_HTTP_TIMEOUT_KEEP_ALIVE = 5 s), so a request is seldom written into a connection the server is closing; one
that is (a thread stalled past the margin) is sent once more at once (`request(resend_stale=True)`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx

from verl_like.rollout.server_backend import Completion, ServerBackend, ServerRequest

logger = logging.getLogger(__name__)
# httpx logs every request at INFO: thousands of lines per rollout.
logging.getLogger("httpx").setLevel(logging.WARNING)


# Below the servers' keep-alive (vLLM: 5 s) by a margin larger than any clock or scheduling skew.
KEEPALIVE_S = 2.0
# What a request written into a connection the server closed meanwhile fails with.
STALE_CONNECTION_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class ServerError(RuntimeError):
    """A vLLM server did not answer, or answered with an error; the message names the server and the route.

    status: the HTTP status it answered with (None when it did not answer); transport: the request failed below
    HTTP (refused, reset, disconnected), so the server may be gone; timed_out: no answer within the timeout.
    """

    def __init__(self, message: str, status: int | None = None, transport: bool = False,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transport = transport
        self.timed_out = timed_out


class ServerClient:
    """Talks to the server at `address` ("http://host:port"); `name` labels it in errors ("server 0"); `backend`:
    its protocol (default vLLM's, rollout/vllm_server.py)."""

    def __init__(self, address: str, name: str, timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 backend: ServerBackend | None = None) -> None:
        if backend is None:
            from verl_like.rollout.vllm_server import VLLM_SERVER

            backend = VLLM_SERVER
        self.backend = backend
        self.address = address.rstrip("/")
        self.name = name
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._clients_lock = threading.Lock()
        self._model: str | None = None
        self._lean: bool | None = None
        # The LoRA adapter every generation request names (rollout/server_lora.py; None: base weights), set by the
        # driver from the server's GET /verl_like/adapter after each weight sync.
        self.lora_name: str | None = None

    def __repr__(self) -> str:
        return f"{self.name} ({self.address})"

    # ----- plumbing -----

    @property
    def _http(self) -> httpx.Client:
        """This thread's HTTP client (module doc: connections are never shared between threads)."""
        client = getattr(self._local, "client", None)
        if client is None or client.is_closed:
            client = httpx.Client(
                base_url=self.address,
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                limits=httpx.Limits(max_connections=4, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_S),
            )
            with self._clients_lock:
                self._clients.append(client)
            self._local.client = client
        return client

    def request(self, method: str, route: str, timeout_s: float | None = None, resend_stale: bool = False,
                **kwargs: Any) -> Any:
        """The JSON answer of `method route`; raises ServerError on a transport error, a timeout or a non-2xx.
        resend_stale: for a request that may run twice (generation: seeded, stateless; reads), send it once more at
        once when a kept-alive connection turns out closed by the server (disconnected or reset before an answer),
        as browsers and urllib3 do; the server's keep-alive may close a connection just as it is reused."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        try:
            try:
                response = self._http.request(method, route, timeout=timeout, **kwargs)
            except STALE_CONNECTION_ERRORS as err:
                if not resend_stale:
                    raise
                logger.debug("%s: %s %s on a connection the server had closed (%s); sending it again", self,
                             method, route, err)
                response = self._http.request(method, route, timeout=timeout, **kwargs)
        except httpx.TimeoutException as err:
            limit = timeout_s if timeout_s is not None else self.timeout_s
            raise ServerError(f"{self}: {method} {route} timed out after {limit:.0f} s ({type(err).__name__})",
                              timed_out=True) from err
        except httpx.HTTPError as err:
            raise ServerError(f"{self}: {method} {route} failed: {type(err).__name__}: {err}", transport=True) from err
        if response.status_code >= 300:
            raise ServerError(f"{self}: {method} {route} answered HTTP {response.status_code}: {response.text[:500]}",
                              status=response.status_code)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def send(self, request: ServerRequest, timeout_s: float | None = None, resend_stale: bool = False) -> Any:
        """`request` (built by the backend) through `request(...)`: its JSON answer."""
        return self.request(request.method, request.route, timeout_s=timeout_s, resend_stale=resend_stale,
                            **request.send_kwargs())

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """True when GET /health answers 200 within `timeout_s`."""
        try:
            return self._http.get("/health", timeout=timeout_s).status_code == 200
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
            time.sleep(0.25)
        raise ServerError(
            f"{self}: no answer on /health after {timeout_s:.0f} s; raise "
            "actor_rollout_ref.rollout.server.start_timeout_s if the machine is slow"
        )

    @property
    def model(self) -> str:
        """The served model name (what completion requests must name)."""
        if self._model is None:
            self._model = self.backend.served_model(self.send(self.backend.models_request()))
        return self._model

    def version(self) -> str:
        """The server's version ("0.25.1" for vLLM): which request shapes its weight-transfer engine takes."""
        return self.backend.server_version(self.send(self.backend.version_request()))

    def world_size(self) -> int:
        """The server's TP × PP × DP worker count (its ranks in a weight-transfer group)."""
        return self.backend.world_size(self.send(self.backend.world_size_request()))

    # ----- generation -----

    @property
    def lean(self) -> bool:
        """Whether the server has verl_like's lean generation route (servers started by `verl_like.serve` do;
        a plain `vllm serve` answers 404 and gets OpenAI completion requests)."""
        return self._probe_lean(10.0)

    def _probe_lean(self, timeout_s: float) -> bool:
        if self._lean is None:
            probe = self.backend.lean_probe_request()
            try:
                self.send(probe, timeout_s=timeout_s, resend_stale=True)
                self._lean = True
            except ServerError as err:
                if err.status != 404:
                    raise
                self._lean = False
                logger.info("%s has no %s route: generating through its standard completions", self, probe.route)
        return self._lean

    def complete(self, prompt_ids: list[int], params: dict[str, Any], timeout_s: float | None = None
                 ) -> list[Completion]:
        """The `params["n"]` samples of one prompt, in sample order (token ids in, token ids out); `timeout_s`
        (default: the client's) bounds each read of the answer."""
        lean = self._probe_lean(min(10.0, timeout_s or self.timeout_s))
        request = self.backend.generate_request(prompt_ids, params, lean=lean, model=None if lean else self.model,
                                                adapter=self.lora_name)
        answer = self.send(request, timeout_s=timeout_s, resend_stale=True)
        try:
            return self.backend.parse_samples(answer, lean=lean)
        except ValueError as err:
            raise ServerError(f"{self}: {err}") from err

    def pause(self, mode: str = "abort") -> None:
        """Stops scheduling: "abort" ends in-flight requests, "keep" freezes them until `resume`."""
        self.send(self.backend.pause_request(mode))

    def resume(self) -> None:
        self.send(self.backend.resume_request())

    def reset_encoder_cache(self) -> None:
        """Drops the server's cached vision-encoder outputs (keyed by image, not weights; a dev-mode route)."""
        self.send(self.backend.reset_encoder_cache_request())

    # ----- weight transfer (the backend's protocol; vLLM's native API) -----

    def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None:
        self.send(self.backend.init_transfer_request(init_info), timeout_s=timeout_s)

    def start_weight_update(self) -> None:
        """Opens a weight update. A server still inside an update that its sender never finished (a trainer that
        died mid-sync) refuses a new one; that update is finished first (every weight is sent again in this one),
        so a restarted trainer can use the same server."""
        start = self.backend.start_update_request()
        try:
            self.send(start)
        except ServerError as err:
            if err.status is None or not self.backend.is_abandoned_update(str(err)):
                raise
            logger.warning("%s: a weight update an earlier sender began was never finished (its trainer died "
                           "mid-sync); finishing it before this one, which sends every weight again", self)
            self.send(self.backend.finish_update_request(None))
            self.send(start)

    def update_weights(self, update_info: dict[str, Any], timeout_s: float) -> None:
        self.send(self.backend.update_request(update_info), timeout_s=timeout_s)

    def finish_weight_update(self, version: int) -> None:
        """Closes the update; the server labels what it samples from now on with policy `version`."""
        self.send(self.backend.finish_update_request(version))

    def close(self) -> None:
        """Closes every thread's client (call it when no request of this client is in flight)."""
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
