"""WeightSender's link choice fails early and by name: an unresolved "auto", and ipc on a machine without CUDA."""

from __future__ import annotations

import pytest
import torch

from verl_like.resharding.transports.server import ServerTransportOptions, WeightSender
from verl_like.rollout.server_client import ServerClient, ServerError


def _sender(weight_transfer: str) -> WeightSender:
    client = ServerClient("http://127.0.0.1:9", "server 0", timeout_s=5.0)  # nothing listens: no call may reach it
    return WeightSender([client], ServerTransportOptions(bucket_bytes=1 << 20, timeout_s=5.0,
                                                         weight_transfer=weight_transfer))


def test_auto_must_be_resolved_before_the_sender_is_built():
    with pytest.raises(ValueError, match="weight_transfer='auto' must be 'gloo' or 'ipc'"):
        _sender("auto")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is for machines without CUDA")
def test_ipc_without_cuda_names_the_option_before_any_request():
    sender = _sender("ipc")
    with pytest.raises(ServerError, match="weight_transfer=ipc needs CUDA"):
        sender.connect()
    sender.close()
