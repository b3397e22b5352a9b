"""Linking adapter-only sync to servers (resharding/transports/server_adapter.py): a server that cannot hold the
adapters (started without LoRA, a rank or window too small, a plain vLLM) fails at link time naming it and the fix."""

from __future__ import annotations

import pytest

from verl_like.resharding.transports.server_adapter import check_lora_servers
from verl_like.rollout.server_client import ServerError


class FakeServer:
    """A client whose GET /verl_like/adapter answers `status` (None: HTTP 404, a server without the route)."""

    def __init__(self, name: str, status: dict | None) -> None:
        self.name, self.status = name, status

    def __repr__(self) -> str:
        return f"{self.name} (http://10.0.0.1:8000)"

    def request(self, method, route, **kwargs):
        if self.status is None:
            raise ServerError(f"{self}: {method} {route} answered HTTP 404", status=404)
        return self.status


def lora_status(rank=8, window=3, next_id=1, active=None) -> dict:
    return {"enabled": True, "max_lora_rank": rank, "max_loras": window, "next_id": next_id, "active": active,
            "loaded": []}


def test_link_takes_the_first_id_unused_on_every_server_and_the_active_adapter():
    servers = [FakeServer("server 0", lora_status(next_id=4, active="policy-3-v2")),
               FakeServer("server 1", lora_status(next_id=7))]
    assert check_lora_servers(servers, 8, window=3) == (7, "policy-3-v2")


@pytest.mark.parametrize(("status", "message"), [
    ({"enabled": False}, r"server 1 \(http://10.0.0.1:8000\) serves no LoRA adapters"),
    (None, "serves no LoRA adapters"),  # a plain `vllm serve`
    (lora_status(rank=4), "needs --max-lora-rank >= 8"),
    (lora_status(window=2), "a window of >= 3"),
])
def test_a_server_that_cannot_hold_the_adapters_is_refused_naming_it_and_the_fix(status, message):
    servers = [FakeServer("server 0", lora_status()), FakeServer("server 1", status)]
    with pytest.raises(ServerError, match=message) as excinfo:
        check_lora_servers(servers, 8, window=3)
    assert "--enable-lora --max-lora-rank 8 --max-loras 3 --max-cpu-loras 3" in str(excinfo.value)
    assert "lora.merge=true" in str(excinfo.value)
