"""ServerClient.start_weight_update against a stand-in HTTP server (httpx's MockTransport): a server left inside an
update by a sender that died mid-sync is finished first, once; other refusals are raised as they are."""

from __future__ import annotations

import httpx
import pytest

from verl_like.rollout.server_client import ServerClient, ServerError

REFUSAL = ("Call to collective_rpc method failed: Worker failed with error 'start_weight_update called while a "
           "weight update is already active. Call finish_weight_update first.'")


def client_on(handler) -> tuple[ServerClient, list[str]]:
    calls: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return handler(request, calls)

    client = ServerClient("http://server-under-test:1", "server 0")
    client._local.client = httpx.Client(base_url=client.address, transport=httpx.MockTransport(record))
    return client, calls


def test_an_update_a_dead_sender_left_open_is_finished_then_started_again():
    active = {"open": True}  # the earlier trainer's update

    def server(request, calls):
        if request.url.path == "/start_weight_update":
            if active["open"]:
                return httpx.Response(500, json={"error": {"message": REFUSAL}})
            active["open"] = True
            return httpx.Response(200, json={})
        if request.url.path == "/finish_weight_update":
            active["open"] = False
            return httpx.Response(200, json={"message": "Weight update finished"})
        return httpx.Response(404)

    client, calls = client_on(server)
    client.start_weight_update()
    assert calls == ["/start_weight_update", "/finish_weight_update", "/start_weight_update"]
    assert active["open"]


def test_other_refusals_are_raised_and_nothing_is_finished():
    client, calls = client_on(lambda request, calls: httpx.Response(500, json={"error": "engine dead"}))
    with pytest.raises(ServerError, match="HTTP 500: .*engine dead"):
        client.start_weight_update()
    assert calls == ["/start_weight_update"]


def test_a_second_refusal_after_the_finish_is_raised():
    client, calls = client_on(lambda request, calls: httpx.Response(
        200 if request.url.path == "/finish_weight_update" else 500, json={"error": {"message": REFUSAL}}))
    with pytest.raises(ServerError, match="already active"):
        client.start_weight_update()
    assert calls == ["/start_weight_update", "/finish_weight_update", "/start_weight_update"]
